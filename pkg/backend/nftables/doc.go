// Package nftables is the nftables backend: one table per family, one
// transaction per verb, and a few map lookups per new connection whatever
// the number of containers.
//
//	table ip cni_portmap {
//	  map hostports        { type inet_proto . inet_service : verdict }              wildcard host IP
//	  map hostip_hostports { type ipv4_addr . inet_proto . inet_service : verdict }  one host IP
//	  map hostport_ranges, hostip_hostport_ranges { the same types; flags interval } a range of ports
//	  map hostport_dnat, hostip_hostport_dnat { … : ipv4_addr . inet_service }       flat attachments' ports
//	  set hairpin_24, hostip_hairpin_24, hairpin_32, …  { source & mask . key }      their hairpin marks
//	  chain prerouting { type nat hook prerouting priority dstnat; fib daddr type local jump dispatch }
//	  chain output     { type nat hook output priority dstnat;     fib daddr type local jump dispatch }
//	  chain dispatch   { ip daddr . meta l4proto . th dport vmap @hostip_hostports
//	                     ip saddr & 255.255.255.0 . ip daddr . meta l4proto . th dport @hostip_hairpin_24 meta mark set meta mark | 0x2000
//	                     dnat ip to ip daddr . meta l4proto . th dport map @hostip_hostport_dnat
//	                     ip daddr . meta l4proto . th dport vmap @hostip_hostport_ranges
//	                     the same four for the wildcard: @hostports, @hairpin_…, @hostport_dnat, @hostport_ranges }
//	  map owners { type ipv6_addr : verdict }                           a goto to each flat attachment's chain, which it holds
//	  chain dn-<hash(net)>-<hash(if:cid)> { comment "net=… id=… if=…"  a flat attachment's: names its owner
//	    meta l4proto tcp th dport 8080 comment "record tcp . 8080" }   and its keys' (rules no chain jumps to)
//	  chain dn-<hash(net)>-<hash(if:cid)> {                         any other attachment's (conditions, ranges, …)
//	    [conditions] ip saddr <subnet> jump mark-bit13 comment "hairpin"       once: only own keys lead here
//	    [conditions] ip saddr 127.0.0.1 jump mark-bit13 comment "localhost"
//	    [conditions] meta l4proto tcp th dport 8080 dnat to 192.0.2.2:80 comment "hostport tcp . 8080"
//	    [conditions] meta l4proto tcp th dport 20000-20999 dnat to 192.0.2.2 comment "hostport tcp . 20000-20999" }
//	    (from 8 single mappings of a host IP kind, one rule for them all, before the ranges':
//	    [conditions] dnat ip to meta l4proto . th dport map { tcp . 8080 : 192.0.2.2 . 80, … } comment "hostports")
//	  chain mark-bit13 { meta mark set meta mark | 0x2000 }
//	  chain masquerade-bit13 { type nat hook postrouting priority srcnat; meta mark & 0x2000 == 0x2000 masquerade }
//	}
//
// Most attachments are flat (flat.go): each host port an element of a
// DNAT map naming its owner, its hairpin marks elements of the hairpin
// sets, so an ADD adds no rule and no verdict a base chain reaches. The
// others (conditions, ranges of ports, another mark bit, many mappings)
// keep a chain of their own, reached from a verdict map element: one
// DNAT rule per run of ports (plan.Runs), or one rule and an anonymous
// map (dnatMap) for many single mappings. A port is held in one map at
// a time; the newest ADD takes it over. layout.go computes what an
// attachment owns; ADD writes it (create, or a pass's repair of the one
// attachment under the host-wide lock), CHECK and the pass judge it
// (judge.go), DEL deletes the elements that still name its chain, then
// the chain.
//
// The backend talks to the kernel itself, over netlink (pkg/nfnl), in
// the objects of pkg/nft: a transaction (nft.Tx) is one nf_tables batch,
// all or nothing, and reads fetch one chain's rules or single map
// elements, so no verb starts a process and CHECK and DEL cost the same
// whatever the number of attachments. The same Tx also renders as the
// nft script nft would compile to the same kernel objects (the golden
// files; a kernel test holds the two equal), and goes to nft only when a
// rule holds conditionsV4/V6, which are nft syntax. This package is the
// layout alone: its names (names.go), keys, shapes and judgments.
package nftables
