#!/usr/bin/env bash
# userland.sh SUITE DIR: a Debian root of SUITE (bullseye, bookworm, trixie)
# with its iptables and nftables in DIR/root, made once with mmdebstrap
# from Debian's archive (DIR/root-v2.stamp marks a finished one), and two
# directories of wrappers that run the root's tools from the host, to be
# put first on PATH:
#
#   DIR/bin         iptables-nft as Debian's alternatives name it: iptables,
#                   iptables-restore, ... -> iptables-nft... -> xtables-nft-multi
#   DIR/bin-legacy  the same names -> iptables-legacy... -> xtables-legacy-multi
#
# Each wrapper runs the root's binary through the root's own dynamic loader
# and libraries (no chroot: /proc, /run/xtables.lock and the network
# namespace stay the caller's), with the root's extensions (XTABLES_LIBDIR).
set -euo pipefail
suite=$1 dir=$(realpath -m "$2")
root=$dir/root

"$(dirname "$0")/../debroot.sh" "$suite" "$dir" root-v2.stamp iptables,nftables,iproute2,kmod

lib=x86_64-linux-gnu
case "$(uname -m)" in
  aarch64) lib=aarch64-linux-gnu ;;
esac
loader=$(cd "$root/lib/$lib" && ls ld-linux*.so.* | head -1)

# wrapper NAME BINARY: a script NAME in DIR/bin that runs the root's
# BINARY with the name it was called by as its first argument (the
# multi-call binaries pick their tool by it).
wrapper() {
  local out=$1 bin=$2 applet=${3:-}
  cat >"$out" <<EOF
#!/bin/sh
# $suite's $bin, run from the host (test/compat/userland.sh)
R='$root'
export XTABLES_LIBDIR="\$R/usr/lib/$lib/xtables"
exec "\$R/lib/$lib/$loader" --library-path "\$R/lib/$lib:\$R/usr/lib/$lib" "\$R/usr/sbin/$bin" $applet "\$@"
EOF
  chmod 0755 "$out"
}

for mode in nft legacy; do
  bin=$dir/bin
  [ "$mode" = legacy ] && bin=$dir/bin-legacy
  rm -rf "$bin"
  mkdir -p "$bin"
  wrapper "$bin/xtables-$mode-multi" "xtables-$mode-multi" '"${0##*/}"'
  for fam in iptables ip6tables; do
    for tool in "" -restore -save; do
      ln -s "xtables-$mode-multi" "$bin/$fam-$mode$tool"
      ln -s "$fam-$mode$tool" "$bin/$fam$tool"
    done
  done
  wrapper "$bin/nft" nft
done
"$dir/bin/iptables" --version
"$dir/bin/nft" --version
