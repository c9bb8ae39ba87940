#!/usr/bin/env bash
# The main job, end to end, in namespaces of its own:
#
#   pm-demo-client --veth-- pm-demo-host (the "node") --ptp-- pm-demo-ctr
#   198.51.100.2            198.51.100.1                       192.0.2.x
#
# cnitool runs a real conflist (ptp + host-local, then our portmap) in the
# node namespace; a web server runs in the container; the client and the
# node's own localhost fetch a page through host port 8080. Nothing touches
# the root namespace. Usage: demo.sh BINDIR (ptp, host-local, portmap,
# cnitool and httpdemo in it).
set -euo pipefail
bin=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/portmap-demo.XXXXXX)
host=pm-demo-host ctr=pm-demo-ctr cl=pm-demo-client

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
H() { ip netns exec "$host" "$@"; }

# The plugin's ledger keeps a directory per network namespace in
# /run/cni-portmap/ledger; the demo's node namespace's goes at the end.
ledger=/run/cni-portmap/ledger
ledger_before=" $(ls "$ledger" 2>/dev/null | tr '\n' ' ' || true) "

cleanup() {
  set +e
  [ -n "${server:-}" ] && kill "$server" 2>/dev/null
  [ -f "$work/conf/demo.conflist" ] && H env NETCONFPATH="$work/conf" CNI_PATH="$bin" \
    "$bin/cnitool" del demo "/var/run/netns/$ctr" 2>/dev/null
  for n in "$cl" "$ctr" "$host"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$work" /var/lib/cni/results/demo-* 2>/dev/null
  for d in $(ls "$ledger" 2>/dev/null); do
    case "$ledger_before" in *" $d "*) ;; *) rm -rf "${ledger:?}/$d" ;; esac
  done
}
trap cleanup EXIT

step "namespaces: node ($host), container ($ctr), client ($cl)"
for n in "$host" "$ctr" "$cl"; do ip netns add "$n"; done
for n in "$host" "$ctr" "$cl"; do ip netns exec "$n" ip link set lo up; done
H ip link add pmdemo0 type veth peer name eth0 netns "$cl"
H ip addr add 198.51.100.1/24 dev pmdemo0
H ip link set pmdemo0 up
ip netns exec "$cl" ip addr add 198.51.100.2/24 dev eth0
ip netns exec "$cl" ip link set eth0 up
ip netns exec "$cl" ip route add default via 198.51.100.1

step "conflist"
mkdir -p "$work/conf"
cat > "$work/conf/demo.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "demo",
  "plugins": [
    {"type": "ptp", "ipMasq": true,
     "ipam": {"type": "host-local", "dataDir": "$work/ipam",
              "ranges": [[{"subnet": "192.0.2.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
cat "$work/conf/demo.conflist"

step "cnitool add demo (container port 80 -> host port 8080)"
H env NETCONFPATH="$work/conf" CNI_PATH="$bin" \
  CAP_ARGS='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}' \
  "$bin/cnitool" add demo "/var/run/netns/$ctr"

step "web server in the container on :80"
ip netns exec "$ctr" "$bin/httpdemo" serve :80 "the container" &
server=$!
for _ in $(seq 30); do
  ip netns exec "$ctr" "$bin/httpdemo" get http://127.0.0.1:80/ >/dev/null 2>&1 && break
  sleep 0.1
done

step "client 198.51.100.2 fetches http://198.51.100.1:8080/ (its own address reaches the container)"
ip netns exec "$cl" "$bin/httpdemo" get http://198.51.100.1:8080/

step "the node fetches http://127.0.0.1:8080/ (localhost, masqueraded)"
H "$bin/httpdemo" get http://127.0.0.1:8080/

step "the node's nat table"
H iptables-save -t nat | grep -v '^#'

step "cnitool check demo"
H env NETCONFPATH="$work/conf" CNI_PATH="$bin" \
  CAP_ARGS='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}' \
  "$bin/cnitool" check demo "/var/run/netns/$ctr" && echo "check: ok"

step "cnitool del demo: the container's rules are gone"
H env NETCONFPATH="$work/conf" CNI_PATH="$bin" \
  CAP_ARGS='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}' \
  "$bin/cnitool" del demo "/var/run/netns/$ctr"
rm "$work/conf/demo.conflist"
H iptables-save -t nat | grep -E 'CNI-(DN|HOSTPORT-DNAT)' || true
if ip netns exec "$cl" "$bin/httpdemo" get http://198.51.100.1:8080/ 2>/dev/null; then
  echo "host port still answers after DEL" >&2
  exit 1
fi
echo "host port 8080 no longer answers"

step "done: tearing down"
