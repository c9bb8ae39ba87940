package nftables

import (
	"encoding/binary"
	"net/netip"
	"strings"

	"github.com/portmap-dev/portmap/pkg/nfnl"
	"github.com/portmap-dev/portmap/pkg/nft"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// The layout's sets and maps, and the elements it writes into them, as
// nft text (golden files, held to knftables) and netlink (held to nft's
// by a kernel test).

// newTx starts a transaction of our table.
func newTx(f plan.Family) *nft.Tx { return nft.NewTx(nft.Family(f), Table) }

// dispatchMap is one of the skeleton's verdict maps: a key to the goto of
// the attachment that owns it.
type dispatchMap struct {
	name     string
	addr     bool // keyed by host address too
	interval bool // keys are intervals of ports
}

// dispatchMaps are the skeleton's maps, in the order the dispatch chain
// looks them up: a specific host IP before the wildcard, an exact port
// before an interval.
var dispatchMaps = []dispatchMap{
	{name: hostIPPortsMap, addr: true},
	{name: hostIPPortRangesMap, addr: true, interval: true},
	{name: hostPortsMap},
	{name: hostPortRangesMap, interval: true},
}

// set is the map as the family declares it.
func (m dispatchMap) set(f nft.Family) *nft.Set {
	return &nft.Set{Name: m.name, Key: keyTypes(f, m.addr), Data: []nft.Type{nft.Verdict}, Interval: m.interval}
}

func isDispatchMap(name string) bool {
	for _, m := range dispatchMaps {
		if m.name == name {
			return true
		}
	}
	return false
}

// keyTypes are a key's types: [host address .] protocol . port.
func keyTypes(f nft.Family, addr bool) []nft.Type {
	if addr {
		return []nft.Type{f.AddrType(), nft.InetProto, nft.InetService}
	}
	return []nft.Type{nft.InetProto, nft.InetService}
}

// element is v as nf_tables holds it: a goto to its chain or, for a flat
// key, its target commented with its chain and hairpin sources; a key
// alone without a chain (deleting).
func (v Element) element(f nft.Family) *nft.Element {
	var set *nft.Set
	if addr := v.Key.HostIP.IsValid(); v.Key.Flat {
		set = dnatMapSet(f, v.Key.Map(), addr)
	} else {
		set = dispatchMap{name: v.Key.Map(), addr: addr, interval: v.Key.IsRange()}.set(f)
	}
	e := &nft.Element{Set: set, Key: v.Key.bytes()}
	if v.Key.IsRange() {
		end := v.Key
		end.Port = v.Key.Last
		e.KeyEnd = end.bytes()
	}
	switch {
	case v.Chain == "":
	case v.Key.Flat:
		e.Data, e.Comment = targetBytes(v.To), flatComment(v.Chain, v.Srcs)
	default:
		e.Goto = v.Chain
	}
	return e
}

func (v Element) Text(tx *nft.Tx, vb nft.Verb, b *strings.Builder) {
	v.element(tx.Family).Text(tx, vb, b)
}

func (v Element) Encode(tx *nft.Tx, vb nft.Verb, m *nfnl.Msg, a *nfnl.Attrs) ([]nfnl.Msg, error) {
	return v.element(tx.Family).Encode(tx, vb, m, a)
}

// bytes is the key as the kernel stores it: each field of the
// concatenation in network order, padded to 4 bytes.
func (k Key) bytes() []byte { return k.appendBytes(nil) }

// appendBytes appends the key's bytes to b.
func (k Key) appendBytes(b []byte) []byte {
	if k.HostIP.IsValid() {
		b = append(b, k.HostIP.AsSlice()...)
	}
	b = append(b, protoNum(k.Protocol), 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(k.Port))
	return append(b, 0, 0)
}

// protoNum is the protocol's IP protocol number.
func protoNum(p plan.Protocol) byte { return nft.ProtoNum(string(p)) }

// flatComment is a flat element's comment: its chain, then its sources.
func flatComment(chain string, srcs []string) string {
	return strings.Join(append([]string{chain}, srcs...), " ")
}

// parseFlatComment reads a flat element's comment back.
func parseFlatComment(c string) (chain string, srcs []string) {
	f := strings.Fields(c)
	if len(f) == 0 {
		return "", nil
	}
	return f[0], f[1:]
}

// targetBytes is a target as a DNAT map's data holds it: the address,
// then the port padded to 4 bytes.
func targetBytes(to netip.AddrPort) []byte {
	return append(binary.BigEndian.AppendUint16(to.Addr().AsSlice(), to.Port()), 0, 0)
}
