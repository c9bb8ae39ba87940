package nfnl

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Verdict decodes the content of an NFTA_DATA_VERDICT attribute: the
// verdict code (NFT_JUMP, NFT_GOTO, NF_DROP, ...) and the chain a jump or
// goto names.
func Verdict(b []byte) (code int32, chain string) {
	for _, a := range Parse(b) {
		switch a.Type {
		case unix.NFTA_VERDICT_CODE:
			code = int32(a.U32())
		case unix.NFTA_VERDICT_CHAIN:
			chain = a.String()
		}
	}
	return code, chain
}

// RuleJumps reads an nf_tables rule message (a GETRULE dump's answer):
// its handle, and the chains its jump and goto verdicts name — what both
// backends need to find the rules that lead to a chain.
func RuleJumps(b []byte) (handle uint64, chains []string) {
	if v, ok := Find(b, unix.NFTA_RULE_HANDLE); ok && len(v) == 8 {
		handle = binary.BigEndian.Uint64(v)
	}
	list, _ := Find(b, unix.NFTA_RULE_EXPRESSIONS)
	for _, e := range Parse(list) {
		name, _ := Find(e.Value, unix.NFTA_EXPR_NAME)
		if string(name) != "immediate\x00" {
			continue
		}
		data, _ := Find(e.Value, unix.NFTA_EXPR_DATA)
		imm, _ := Find(data, unix.NFTA_IMMEDIATE_DATA)
		vd, ok := Find(imm, unix.NFTA_DATA_VERDICT)
		if !ok {
			continue
		}
		if code, chain := Verdict(vd); (code == unix.NFT_JUMP || code == unix.NFT_GOTO) && chain != "" {
			chains = append(chains, chain)
		}
	}
	return handle, chains
}

// NftType is the netlink message type of nf_tables message m
// (unix.NFT_MSG_*): the subsystem in the high byte.
func NftType(m int) uint16 { return uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | m) }
