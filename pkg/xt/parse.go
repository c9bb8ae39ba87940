package xt

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// ParseRule reads a rule of an iptables -S line's tokens ("-A CHAIN …",
// or those after the chain) into a Rule's fields, as Args spells them;
// every other token goes, in order, to Matches, a negated match too
// ("! -s 10.0.0.0/8"); a -m that names the module of a field ("-m tcp")
// is dropped.
func ParseRule(tokens []string) Rule {
	var r Rule
	fields := map[string]*string{"-A": &r.Chain, "-s": &r.Src, "-d": &r.Dst, "--dport": &r.Dport, "--dports": &r.Dports,
		"--destination-ports": &r.Dports, "--comment": &r.Comment, "-j": &r.Jump, "--to-destination": &r.To,
		"--set-xmark": &r.SetXmark, "--ctorigdst": &r.Ct.OrigDst, "--ctorigdstport": &r.Ct.OrigDstPort,
		"--ctreplsrc": &r.Ct.ReplSrc, "--ctreplsrcport": &r.Ct.ReplSrcPort}
	for i := 0; i < len(tokens); i++ {
		t := tokens[i]
		if i+1 < len(tokens) && (i == 0 || tokens[i-1] != "!") { // a negated match stays in Matches
			v := tokens[i+1]
			if f, ok := fields[t]; ok {
				*f, i = v, i+1
				continue
			}
			switch {
			case t == "-p":
				r.Proto, i = plan.Protocol(v), i+1
				continue
			case t == "-m" && (v == "tcp" || v == "udp" || v == "sctp" || v == "comment" || v == "multiport"):
				i++
				continue
			case t == "--ctstate" && v == "DNAT":
				i++ // forwardAccept's, with its Conntrack fields
				continue
			}
		}
		r.Matches = append(r.Matches, t)
	}
	if r.Ct != (Conntrack{}) { // the module of forwardAccept's Conntrack fields
		for i := 0; i+1 < len(r.Matches); i++ {
			if r.Matches[i] == "-m" && r.Matches[i+1] == "conntrack" {
				r.Matches = slices.Delete(r.Matches, i, i+2)
				break
			}
		}
	}
	return r
}

// PortRange reads "8080" or "20000:20999" (sep between first and
// last).
func PortRange(s, sep string) ([2]int, bool) {
	a, b, isRange := strings.Cut(s, sep)
	first, err := strconv.Atoi(a)
	if err != nil {
		return [2]int{}, false
	}
	last := first
	if isRange {
		if last, err = strconv.Atoi(b); err != nil {
			return [2]int{}, false
		}
	}
	return [2]int{first, last}, true
}

// ResolveDNAT is where a DNAT --to-destination sends a packet to port
// dport: "ip:port" as given; "ip" keeps the port; "ip:first-last/base"
// keeps the offset from base.
func ResolveDNAT(to string, dport int) string {
	host, port, err := net.SplitHostPort(to)
	if err != nil { // no port
		return net.JoinHostPort(strings.Trim(to, "[]"), strconv.Itoa(dport))
	}
	ports, base, shifted := strings.Cut(port, "/")
	r, ok := PortRange(ports, "-")
	if !ok {
		return to
	}
	if shifted {
		b, err := strconv.Atoi(base)
		if err != nil {
			return to
		}
		return net.JoinHostPort(host, strconv.Itoa(r[0]+dport-b))
	}
	return net.JoinHostPort(host, strconv.Itoa(r[0]))
}
