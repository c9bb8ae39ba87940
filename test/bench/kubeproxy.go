package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// kubeProxyRules is the nat table kube-proxy's iptables mode writes for
// services ClusterIP Services of one endpoint each (its v1.34 layout:
// KUBE-SERVICES reached from PREROUTING and OUTPUT, a KUBE-SVC- chain and
// a KUBE-SEP- chain per Service, the masquerade mark and its
// postrouting), as iptables-restore input.
func kubeProxyRules(services int) string {
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	for i := range services {
		fmt.Fprintf(&b, ":KUBE-SVC-%016X - [0:0]\n:KUBE-SEP-%016X - [0:0]\n", i, i)
	}
	b.WriteString(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
`)
	for i := range services {
		svc, ep := fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), fmt.Sprintf("10.245.%d.%d", i/250, 1+i%250)
		name := fmt.Sprintf("default/svc%d", i)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016X\n", svc, name, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016X ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ\n", i, svc, name)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016X -m comment --comment \"%s -> %s:8080\" -j KUBE-SEP-%016X\n", i, name, ep, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016X -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", i, ep, name)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016X -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s:8080\n", i, name, ep)
	}
	b.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n")
	return b.String()
}

// besideKubeProxy writes kube-proxy's rules of services Services into
// the host's namespace.
func besideKubeProxy(services int) {
	cmd := exec.Command("iptables-restore", "--noflush")
	cmd.Stdin = strings.NewReader(kubeProxyRules(services))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		fatalf("kube-proxy's rules of %d Services: %v: %s", services, err, out.String())
	}
}

// measureBesideKubeProxy times the verbs of one container (none other
// mapped) beside kube-proxy's rules of every count of services.
func measureBesideKubeProxy(plugin, backend string, services []int, samples int) []latency {
	return sampleHosts(plugin, backend, services, samples, func(n int) {
		progress("beside kube-proxy %s %s: %d Services", plugin, backend, n)
		besideKubeProxy(n)
	})
}

// kubeProxyRows are the table beside kube-proxy: a row per backend, verb
// and count of Services.
func (r *report) kubeProxyRows() [][]string {
	var rows [][]string
	find := func(plugin, backend, verb string, n int) *latency {
		for i := range r.KubeProxy {
			if l := &r.KubeProxy[i]; l.Plugin == plugin && l.Backend == backend && l.Verb == verb && l.N == n {
				return l
			}
		}
		return nil
	}
	seen := map[string]bool{}
	for _, l := range r.KubeProxy {
		key := fmt.Sprint(l.Backend, l.Verb, l.N)
		if l.Plugin != "ours" || seen[key] {
			continue
		}
		seen[key] = true
		row := []string{l.Backend, l.Verb, fmt.Sprint(l.N), fmt.Sprintf("%.1f", l.P50), "-", "-", "-"}
		if u := find("upstream", l.Backend, l.Verb, l.N); u != nil {
			row[4], row[5] = fmt.Sprintf("%.1f", u.P50), fmt.Sprintf("%.2f", l.P50/u.P50)
		}
		if z := find("ours", l.Backend, l.Verb, 0); z != nil && l.N != 0 {
			row[6] = fmt.Sprintf("%.2f", l.P50/z.P50)
		}
		rows = append(rows, row)
	}
	return rows
}

var kubeProxyHead = []string{"backend", "verb", "Services", "ours p50 ms", "upstream p50 ms", "ours ÷ upstream", "ours ÷ ours beside none"}

const kubeProxyTitle = "ADD / CHECK / DEL of one container beside kube-proxy's iptables rules of S Services"

func kubeProxyText(r *report) string {
	if len(r.KubeProxy) == 0 {
		return ""
	}
	return "\n" + kubeProxyTitle + "\n" + textTable(kubeProxyHead, r.kubeProxyRows())
}

func kubeProxyMarkdown(r *report) string {
	if len(r.KubeProxy) == 0 {
		return ""
	}
	return "\n### " + kubeProxyTitle + "\n\nkube-proxy's iptables mode as v1.34 lays it out (a KUBE-SVC- and a KUBE-SEP- chain per Service, reached from PREROUTING and OUTPUT), written with iptables-restore into a namespace of its own; the container is the latency table's, with no other container mapped.\n\n" + mdTable(kubeProxyHead, r.kubeProxyRows())
}
