#!/usr/bin/env bash
# guest.sh SUITE DIR [--] COMMAND...: boots Debian SUITE's own kernel
# (bullseye 5.10, bookworm 6.1, trixie 6.12) in a QEMU guest and runs
# COMMAND in it as root; exits with COMMAND's status.
#
# Made once in DIR (a stamp marks each finished part):
#   DIR/kernel    the linux-image package of SUITE (its -security suite
#                 too), unpacked with dpkg-deb: no install; its modules
#                 uncompressed and indexed with the host's depmod
#   DIR/initrd    busybox-static and an /init that loads virtio and 9p,
#                 mounts the guest root read-only under a tmpfs overlay
#                 and runs the command
# Shared from the host (virtio-9p, read-only): GUEST_ROOT (a Debian root
# with the tools the tests run: iptables, nftables, iproute2, kmod), the
# kernel's modules, and this working directory (build outputs: the test
# binaries, the CNI plugins), at the same path as on the host.
#
# Hardware acceleration where /dev/kvm boots a guest, QEMU's emulator
# (TCG) where not (this machine's kvm is a paravirtual nested one an
# unmodified kernel does not boot on): GUEST_ACCEL=kvm|tcg overrides.
set -euo pipefail
suite=$1 dir=$(realpath -m "$2")
shift 2
[ "${1:-}" = "--" ] && shift
root=${GUEST_ROOT:?GUEST_ROOT names the guest root (test/compat/userland.sh)}
work=$(pwd)
mkdir -p "$dir"

# The kernel package, through apt with a sources list of its own.
if [ ! -e "$dir/kernel.stamp" ]; then
  apt_dir=$dir/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  printf 'deb http://deb.debian.org/debian %s main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
    "$suite" "$suite" >"$apt_dir/sources.list"
  opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o Dir::State::status=/dev/null
    -o APT::Sandbox::User=root)
  apt-get -qq "${opts[@]}" update
  pkg=$(apt-cache "${opts[@]}" depends linux-image-amd64 | grep -o 'linux-image-[0-9][^ ]*-amd64' | head -1)
  (cd "$apt_dir" && apt-get -qq "${opts[@]}" download "$pkg")
  rm -rf "$dir/kernel"
  dpkg-deb -x "$apt_dir"/"$pkg"_*.deb "$dir/kernel"
  rm -f "$apt_dir"/*.deb
  mods=$(ls -d "$dir"/kernel/lib/modules/* "$dir"/kernel/usr/lib/modules/* 2>/dev/null | head -1 || true)
  find "$mods" -name '*.ko.xz' -exec xz -d {} +
  find "$mods" -name '*.ko.zst' -exec zstd -q -d --rm {} +
  depmod -b "${mods%/lib/modules/*}" "${mods##*/}"
  touch "$dir/kernel.stamp"
fi
mods=$(ls -d "$dir"/kernel/lib/modules/* "$dir"/kernel/usr/lib/modules/* 2>/dev/null | head -1 || true)
release=${mods##*/}
vmlinuz=$(ls "$dir"/kernel/boot/vmlinuz-*)

# The initramfs: busybox, the modules that reach the shares, /init.
if [ ! -e "$dir/initrd.stamp" ]; then
  ird=$dir/initrd.d
  rm -rf "$ird"
  mkdir -p "$ird"/{bin,proc,sys,dev,mnt/root,mnt/ro,mnt/rw,mnt/mods,mnt/work}
  cp /bin/busybox "$ird/bin/busybox"
  for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p overlay; do
    f=$(find "$mods/kernel" -name "$m.ko" | head -1)
    [ -n "$f" ] && cp "$f" "$ird/"
  done
  cat >"$ird/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
# the kernel runs its module loader (/sbin/modprobe) in this root, not
# the chroot's: it hands over to the guest root's kmod
mkdir -p /sbin
printf '#!/bin/busybox sh\nexec /bin/chroot /mnt/root /sbin/modprobe "$@"\n' >/sbin/modprobe
chmod 0755 /sbin/modprobe
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p overlay; do
  [ -e /$m.ko ] && insmod /$m.ko 2>/dev/null
done
p9=trans=virtio,version=9p2000.L,msize=262144,cache=loose
if ! mount -t 9p -o ro,$p9 root /mnt/ro; then
  dmesg | tail -20
  echo "pm-guest: exit 125"
  poweroff -f
fi
mount -t tmpfs -o size=1g tmpfs /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/ro,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /mnt/root
# /tmp and /run first: the checkout may live under either
mount -t tmpfs tmpfs /mnt/root/tmp
mount -t tmpfs tmpfs /mnt/root/run
r=$(uname -r)
mkdir -p /mnt/root/lib/modules/$r
mount -t 9p -o ro,$p9 mods /mnt/root/lib/modules/$r
work=$(cat /proc/cmdline | tr ' ' '\n' | sed -n 's/^pm.work=//p')
mkdir -p /mnt/root$work
mount -t 9p -o ro,$p9 work /mnt/root$work
mkdir -p /mnt/root/pm
mount -t 9p -o ro,$p9 pmrun /mnt/root/pm
for d in proc sys dev; do mount --move /$d /mnt/root/$d 2>/dev/null || mount --bind /$d /mnt/root/$d; done
mount -t cgroup2 none /mnt/root/sys/fs/cgroup 2>/dev/null
mount -t bpf none /mnt/root/sys/fs/bpf 2>/dev/null
echo "pm-guest: booted $(uname -r)"
chroot /mnt/root /bin/sh -c '. /pm/work.env; cd "$PM_WORK"; exec /bin/sh /pm/cmd' </dev/console >/dev/console 2>&1
echo "pm-guest: exit $?"
poweroff -f
EOF
  chmod 0755 "$ird/init"
  (cd "$ird" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$dir/initrd"
  touch "$dir/initrd.stamp"
fi

# The command and the environment it runs in, in a share of their own.
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
{
  printf 'export PM_WORK=%q\n' "$work"
  printf 'export PATH=%q\n' "/usr/sbin:/usr/bin:/sbin:/bin"
  # tests that need what only Debian's kernels have (SCTP) fail here
  # where the host's kernel lets them skip
  printf 'export PORTMAP_GUEST=1\n'
  for v in CI PORTMAP_CNI_BIN; do
    [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
} >"$run/work.env"
printf '%q ' "$@" >"$run/cmd"
echo >>"$run/cmd"
accel=${GUEST_ACCEL:-tcg}
log=$run/console
boot() {
  timeout "${GUEST_TIMEOUT:-1800}" qemu-system-x86_64 -accel "$accel" -m "${GUEST_MEM:-2048}" -smp 2 \
    -kernel "$vmlinuz" -initrd "$dir/initrd" \
    -append "console=ttyS0 panic=-1 quiet pm.work=$work" \
    -virtfs local,path="$root",mount_tag=root,security_model=none,readonly=on \
    -virtfs local,path="$mods",mount_tag=mods,security_model=none,readonly=on \
    -virtfs local,path="$work",mount_tag=work,security_model=none,readonly=on \
    -virtfs local,path="$run",mount_tag=pmrun,security_model=none,readonly=on \
    -nographic -no-reboot -nodefaults -serial stdio </dev/null | tee "$log" | sed -u 's/\r$//'
}
boot
# A kernel that dies before the init hands over (no "booted" line: the
# emulator's cross-modifying code has oopsed 6.12 at 1.8 s, patching its
# own text with int3) ran nothing of ours: boot it once more, saying so.
# A guest that booted is never run twice.
if ! grep -q 'pm-guest: booted' "$log"; then
  echo "guest.sh: the kernel died before the command started ($release); booting it once more" >&2
  boot
fi
status=$(sed -n 's/^pm-guest: exit \([0-9]*\).*/\1/p' "$log" | tr -d '\r' | tail -1)
if [ -z "$status" ]; then
  echo "guest.sh: the guest ended without the command's status ($release)" >&2
  exit 1
fi
exit "$status"
