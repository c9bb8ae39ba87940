#!/usr/bin/env bash
# Installs the host tools the plugin, its tests and the demo use, when they
# are missing (Debian/Ubuntu, as root). "deps.sh demo": only what the demo
# uses (make demo); no argument: what every test uses besides (make test).
set -euo pipefail
need=()
command -v iptables-restore >/dev/null || need+=(iptables)
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
command -v conntrack >/dev/null || need+=(conntrack)
command -v unshare >/dev/null || need+=(util-linux)
if [ "${1:-}" != demo ]; then
# The image tests (test/image) build and run the image with podman.
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
# The kube suite (make kube-test) runs Debian's containerd under a kubelet.
command -v containerd >/dev/null || need+=(containerd)
# Its control plane test stores the cluster in Debian's etcd.
command -v etcd >/dev/null || need+=(etcd-server)
# make compat-test makes Debian roots of other releases' iptables and nft.
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
# Its two-node test builds flanneld with cgo, as flannel releases it.
command -v gcc >/dev/null || need+=(gcc libc6-dev)
# make guest-test boots Debian's kernels in QEMU (the emulator), from an
# initramfs of busybox; depmod indexes their modules.
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v busybox >/dev/null || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
# make cross-test runs the unit tests of arm64 and s390x under qemu-user.
command -v qemu-s390x-static >/dev/null || need+=(qemu-user-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing: ${need[*]} (install them, or run as root on Debian)" >&2
    exit 1
  fi
  echo "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The tests start containerd and etcd in namespaces of their own; the
  # packages must not start them on the machine (policy-rc.d says no),
  # unless the machine already has a policy of its own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "go is not on PATH" >&2; exit 1; }
