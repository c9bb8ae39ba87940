#!/usr/bin/env bash
# root.sh SUITE DIR: a Debian root of SUITE (bookworm: firewalld 1.3,
# trixie: firewalld 2.3) with firewalld, its D-Bus system bus daemon and
# client tools (dbus-send, dbus-monitor) and
# the iptables and nft it drives, in DIR/root, made once with mmdebstrap
# from Debian's archive (DIR/root.stamp marks a finished one). The
# firewalld suite runs them chrooted in namespaces of its own; nothing is
# installed on the machine, so nothing starts there.
set -euo pipefail
suite=$1 dir=$(realpath -m "$2")
root=$dir/root
"$(dirname "$0")/../debroot.sh" "$suite" "$dir" root.stamp \
  firewalld,dbus-daemon,dbus-bin,iptables,nftables,iproute2,python3-nftables
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' firewalld
