#!/usr/bin/env bash
# debroot.sh SUITE DIR STAMP PACKAGES: a minimal Debian root of SUITE with
# PACKAGES (comma-separated) in DIR/root, made with mmdebstrap from
# Debian's archive unless DIR/STAMP marks a finished one (its log in
# DIR/mmdebstrap.log). Nothing is installed on the machine.
set -euo pipefail
suite=$1 dir=$(realpath -m "$2") stamp=$3 packages=$4
root=$dir/root
[ -e "$dir/$stamp" ] && exit 0
command -v mmdebstrap >/dev/null || {
  echo "debroot.sh: mmdebstrap is missing (test/deps.sh installs it)" >&2
  exit 1
}
rm -rf "$root"
mkdir -p "$dir"
mmdebstrap --quiet --variant=minbase --include="$packages" \
  "$suite" "$root" >"$dir/mmdebstrap.log" 2>&1 || {
  tail -20 "$dir/mmdebstrap.log" >&2
  exit 1
}
touch "$dir/$stamp"
