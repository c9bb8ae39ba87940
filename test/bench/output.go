package main

import (
	"fmt"
	"sort"
	"strings"
)

func (r *report) header() string {
	var b strings.Builder
	fmt.Fprintf(&b, "portmap benchmark, %s: %d cores, kernel %s; %s; upstream portmap %s; %d samples per figure; run took %s\n",
		r.Date, r.Cores, r.Kernel, r.Tools, r.Upstream, r.Samples, r.elapsed.Round(1e9))
	var fl []string
	for _, f := range r.Floor {
		fl = append(fl, fmt.Sprintf("%s %.1f ms, %.1f MiB resident (%.1f private), binary %.2f MB", f.Plugin, f.P50, float64(f.RSS)/1024, float64(f.Private)/1024, float64(f.Size)/1e6))
	}
	fmt.Fprintf(&b, "no-op start (VERSION, p50): %s\n", strings.Join(fl, ", "))
	return b.String()
}

func (r *report) find(plugin, backend, verb string, n int) *latency {
	for i := range r.Latency {
		l := &r.Latency[i]
		if l.Plugin == plugin && l.Backend == backend && l.Verb == verb && l.N == n {
			return l
		}
	}
	return nil
}

func (r *report) backends() []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range r.Latency {
		if !seen[l.Backend] {
			seen[l.Backend] = true
			out = append(out, l.Backend)
		}
	}
	return out
}

func (r *report) ns() []int {
	seen := map[int]bool{}
	var out []int
	for _, l := range r.Latency {
		if !seen[l.N] {
			seen[l.N] = true
			out = append(out, l.N)
		}
	}
	sort.Ints(out)
	return out
}

// rows are the latency table: one row per backend, verb and N.
func (r *report) rows() [][]string {
	var rows [][]string
	for _, be := range r.backends() {
		for _, verb := range verbs {
			for _, n := range r.ns() {
				o, u := r.find("ours", be, verb, n), r.find("upstream", be, verb, n)
				if o == nil || u == nil {
					continue
				}
				rows = append(rows, []string{be, verb, fmt.Sprint(n),
					fmt.Sprintf("%.1f / %.1f", o.P50, o.P90), fmt.Sprintf("%.1f / %.1f", u.P50, u.P90),
					fmt.Sprintf("%.2f", o.P50/u.P50), fmt.Sprintf("%d / %d", o.Procs, u.Procs)})
			}
		}
	}
	return rows
}

var latencyHead = []string{"backend", "verb", "N", "ours p50 / p90 ms", "upstream p50 / p90 ms", "ours ÷ upstream (p50)", "processes ours / upstream"}

// growth is p50 at the largest N over p50 at N=0, per plugin.
func (r *report) growth() [][]string {
	ns := r.ns()
	if len(ns) < 2 || ns[0] != 0 {
		return nil
	}
	top := ns[len(ns)-1]
	var rows [][]string
	for _, be := range r.backends() {
		for _, verb := range verbs {
			row := []string{be, verb}
			for _, p := range plugins {
				a, b := r.find(p, be, verb, 0), r.find(p, be, verb, top)
				if a == nil || b == nil {
					row = append(row, "-")
					continue
				}
				row = append(row, fmt.Sprintf("%.2f", b.P50/a.P50))
			}
			rows = append(rows, row)
		}
	}
	return rows
}

func (r *report) growthHead() []string {
	ns := r.ns()
	g := fmt.Sprintf("N=%d ÷ N=0", ns[len(ns)-1])
	return []string{"backend", "verb", "ours " + g, "upstream " + g}
}

func (r *report) connRows() [][]string {
	var rows [][]string
	for _, c := range r.Conns {
		rows = append(rows, []string{c.Backend, c.Plugin, fmt.Sprint(c.N),
			fmt.Sprintf("%.0f", c.HostPort), fmt.Sprintf("%.0f", c.Direct), fmt.Sprintf("%.2f", c.Ratio)})
	}
	return rows
}

var connHead = []string{"backend", "plugin", "mappings", "via host port /s", "direct /s", "host port ÷ direct"}

func (r *report) text() string {
	var b strings.Builder
	b.WriteString(r.header())
	b.WriteString("\nADD / CHECK / DEL of one more container (a TCP and a UDP mapping; \"tcp\": the TCP one only) with N containers mapped\n")
	b.WriteString(textTable(latencyHead, r.rows()))
	if g := r.growth(); g != nil {
		b.WriteString("\nGrowth with N (p50)\n")
		b.WriteString(textTable(r.growthHead(), g))
	}
	if len(r.Sync) > 0 {
		b.WriteString("\nportmap sync (ours; upstream has none) with N cached attachments\n")
		b.WriteString(textTable(syncHead, r.syncRows()))
		b.WriteString("\nThe node agent (portmap-agent sync --watch) and STATUS with N cached attachments\n")
		b.WriteString(textTable(agentHead, r.agentRows()))
	}
	b.WriteString(kubeProxyText(r))
	b.WriteString(manyText(r))
	if len(r.Conns) > 0 {
		b.WriteString("\nNew TCP connections per second from a client namespace\n")
		b.WriteString(textTable(connHead, r.connRows()))
	}
	b.WriteString(socketText(r))
	if g := r.goals(); g != nil {
		b.WriteString("\nGoals (this run)\n")
		b.WriteString(textTable(goalHead, g))
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	b.WriteString("# Benchmark results\n\n")
	b.WriteString(strings.ReplaceAll(r.header(), "\n", "\n\n"))
	b.WriteString("### ADD / CHECK / DEL of one more container with N containers mapped\n\n")
	b.WriteString("The container has a TCP and a UDP mapping (the UDP one makes ADD and DEL flush conntrack: the bench keeps one entry in the namespace, so the flush reads its table, as on any node); \"ADD tcp\" and \"DEL tcp\" are the same container with its TCP mapping only.\n\n")
	b.WriteString(mdTable(latencyHead, r.rows()))
	if g := r.growth(); g != nil {
		b.WriteString("\n### Growth with N (p50)\n\n")
		b.WriteString(mdTable(r.growthHead(), g))
	}
	if len(r.Sync) > 0 {
		b.WriteString("\n### portmap-agent sync (ours; upstream has none) with N cached attachments\n\n")
		b.WriteString(mdTable(syncHead, r.syncRows()))
		b.WriteString("\n### The node agent (portmap-agent sync --watch) and STATUS with N cached attachments\n\n")
		b.WriteString(mdTable(agentHead, r.agentRows()))
	}
	b.WriteString(kubeProxyMarkdown(r))
	b.WriteString(manyMarkdown(r))
	if len(r.Conns) > 0 {
		b.WriteString("\n### New TCP connections per second\n\n")
		fmt.Fprintf(&b, "From a client namespace to the host port and to the container's address (connect, read a line, close), in %d rounds of one run of each, the one that goes first alternating; the median run of each, and the median of the rounds' ratios.\n\n", connRounds)
		b.WriteString(mdTable(connHead, r.connRows()))
	}
	b.WriteString(socketMarkdown(r))
	if g := r.goals(); g != nil {
		b.WriteString("\n### Goals (this run)\n\n")
		b.WriteString(mdTable(goalHead, g))
	}
	b.WriteString("\n![latency against N](latency.svg)\n")
	return b.String()
}

func textTable(head []string, rows [][]string) string {
	w := make([]int, len(head))
	for _, row := range append([][]string{head}, rows...) {
		for i, c := range row {
			w[i] = max(w[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, row := range append([][]string{head}, rows...) {
		for i, c := range row {
			fmt.Fprintf(&b, "%-*s  ", w[i], c)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func mdTable(head []string, rows [][]string) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for range head {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
	for _, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return b.String()
}

// svg plots p50 latency against N: one panel per verb, one line per plugin
// and backend.
func (r *report) svg() string {
	const pw, ph, pad, top = 300, 220, 50, 40
	verbs := []string{"ADD", "CHECK", "DEL"}
	ns := r.ns()
	type series struct{ plugin, backend, color, dash string }
	var ss []series
	colors := map[string]string{"iptables": "#1f77b4", "nftables": "#d62728"}
	for _, be := range r.backends() {
		ss = append(ss, series{"ours", be, colors[be], ""}, series{"upstream", be, colors[be], "6,4"})
	}
	maxY := 1.0
	for _, l := range r.Latency {
		maxY = max(maxY, l.P50)
	}
	maxY *= 1.1
	width := len(verbs)*(pw+pad) + pad
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, ph+top+90)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">p50 latency (ms) against containers already mapped (N) — %s, %d cores</text>`+"\n", pad, r.Date, r.Cores)
	x := func(i int) float64 {
		if len(ns) == 1 {
			return pw / 2
		}
		return float64(i) * pw / float64(len(ns)-1)
	}
	y := func(v float64) float64 { return ph - v/maxY*ph }
	for vi, verb := range verbs {
		ox, oy := pad+vi*(pw+pad), top
		fmt.Fprintf(&b, `<g transform="translate(%d,%d)"><text x="0" y="-6" font-weight="bold">%s</text>`, ox, oy, verb)
		fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" stroke="black"/><line x1="0" y1="0" x2="0" y2="%d" stroke="black"/>`, ph, pw, ph, ph)
		for i, n := range ns {
			fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%d</text>`, x(i), ph+14, n)
		}
		for k := 0; k <= 4; k++ {
			v := maxY * float64(k) / 4
			fmt.Fprintf(&b, `<text x="-4" y="%.0f" text-anchor="end">%.0f</text><line x1="0" y1="%.0f" x2="%d" y2="%.0f" stroke="#eee"/>`, y(v)+4, v, y(v), pw, y(v))
		}
		for _, s := range ss {
			var pts []string
			for i, n := range ns {
				if l := r.find(s.plugin, s.backend, verb, n); l != nil {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(l.P50)))
				}
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`, s.color, s.dash, strings.Join(pts, " "))
		}
		b.WriteString("</g>\n")
	}
	for i, s := range ss {
		lx, ly := pad+i*180, ph+top+50
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/><text x="%d" y="%d">%s, %s</text>`+"\n",
			lx, ly, lx+30, ly, s.color, s.dash, lx+36, ly+4, s.plugin, s.backend)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

var syncHead = []string{"backend", "N", "nothing to repair p50 ms", "÷ ADD at N=0", "a --watch pass, nothing to repair, p50 ms", "÷ ADD at N=0 (goal ≤ 3)", "after a full flush p50 ms", "÷ ADD at N=0 (goal ≤ 30)"}

// syncRows relate each sync pass to one ADD of ours at N=0 of the same
// backend, the yardstick of the goals.
func (r *report) syncRows() [][]string {
	var rows [][]string
	for _, s := range r.Sync {
		ratio := func(v float64) string {
			if a := r.find("ours", s.Backend, "ADD", 0); a != nil && a.P50 > 0 {
				return fmt.Sprintf("%.1f", v/a.P50)
			}
			return "-"
		}
		rows = append(rows, []string{s.Backend, fmt.Sprint(s.N), fmt.Sprintf("%.1f", s.NothingP50), ratio(s.NothingP50),
			fmt.Sprintf("%.1f", s.WatchP50), ratio(s.WatchP50),
			fmt.Sprintf("%.1f (%d samples)", s.RepairP50, s.RepairCount), ratio(s.RepairP50)})
	}
	return rows
}

// goalHead and goals are the speed goals of the netlink issue, each with
// what this run measured: the table the README keeps.
var goalHead = []string{"goal", "measured", "met"}

func (r *report) goals() [][]string {
	ns := r.ns()
	if len(ns) < 2 || ns[0] != 0 {
		return nil
	}
	top := ns[len(ns)-1]
	var rows [][]string
	add := func(goal, measured string, met bool) {
		m := "no"
		if met {
			m = "yes"
		}
		rows = append(rows, []string{goal, measured, m})
	}
	floor := 0.0
	for _, f := range r.Floor {
		if f.Plugin == "ours" {
			floor = f.P50
		}
	}
	if a, c, d := r.find("ours", "nftables", "ADD", top), r.find("ours", "nftables", "CHECK", top), r.find("ours", "nftables", "DEL", top); a != nil && c != nil && d != nil {
		add("nftables: processes per ADD / CHECK / DEL = 0 / 0 / 0", fmt.Sprintf("%d / %d / %d", a.Procs, c.Procs, d.Procs), a.Procs+c.Procs+d.Procs == 0)
	}
	for _, verb := range verbs {
		a, b := r.find("ours", "nftables", verb, 0), r.find("ours", "nftables", verb, top)
		if a == nil || b == nil {
			continue
		}
		ratio := b.P50 / a.P50
		add(fmt.Sprintf("nftables %s: p50 at N=%d ≤ 1.2× p50 at N=0", verb, top), fmt.Sprintf("%.2f×", ratio), ratio <= 1.2)
	}
	for _, verb := range []string{"ADD", "ADD tcp"} {
		if a := r.find("ours", "nftables", verb, top); a != nil && floor > 0 {
			ratio := a.P50 / floor
			add(fmt.Sprintf("nftables %s: p50 at N=%d ≤ 1.5× VERSION p50 (%.1f ms)", verb, top, floor), fmt.Sprintf("%.2f×", ratio), ratio <= 1.5)
		}
	}
	for _, verb := range []string{"CHECK", "DEL"} {
		if o, u := r.find("ours", "nftables", verb, top), r.find("upstream", "nftables", verb, top); o != nil && u != nil {
			ratio := o.P50 / u.P50
			add(fmt.Sprintf("nftables %s: p50 at N=%d ≤ 0.15× upstream", verb, top), fmt.Sprintf("%.2f×", ratio), ratio <= 0.15)
		}
	}
	for _, verb := range []string{"ADD", "ADD tcp"} {
		if o, u := r.find("ours", "iptables", verb, top), r.find("upstream", "iptables", verb, top); o != nil && u != nil {
			add(fmt.Sprintf("iptables %s: p50 at N=%d ≤ 0.12× upstream", verb, top), fmt.Sprintf("%.2f×", o.P50/u.P50), o.P50/u.P50 <= 0.12)
		}
	}
	// Flat in N: every iptables verb.
	for _, verb := range verbs {
		if o, z := r.find("ours", "iptables", verb, top), r.find("ours", "iptables", verb, 0); o != nil && z != nil && top > 0 {
			add(fmt.Sprintf("iptables %s: p50 at N=%d ≤ 1.5× ours at N=0", verb, top), fmt.Sprintf("%.2f×", o.P50/z.P50), o.P50/z.P50 <= 1.5)
		}
	}
	// Every verb, both backends, every N: at most half of upstream's.
	for _, be := range r.backends() {
		for _, verb := range verbs {
			for _, n := range r.ns() {
				if o, u := r.find("ours", be, verb, n), r.find("upstream", be, verb, n); o != nil && u != nil {
					add(fmt.Sprintf("%s %s: p50 at N=%d ≤ 0.5× upstream", be, verb, n), fmt.Sprintf("%.2f×", o.P50/u.P50), o.P50/u.P50 <= 0.5)
				}
			}
		}
	}
	if a, c, d := r.find("ours", "iptables", "ADD", top), r.find("ours", "iptables", "CHECK", top), r.find("ours", "iptables", "DEL", top); a != nil && c != nil && d != nil {
		// iptables-nft: each verb is nf_tables netlink, no process
		// (iptables-legacy: one iptables-restore or listing)
		add("iptables (iptables-nft): processes per ADD / CHECK / DEL = 0 / 0 / 0", fmt.Sprintf("%d / %d / %d", a.Procs, c.Procs, d.Procs), a.Procs+c.Procs+d.Procs == 0)
	}
	for _, be := range r.backends() {
		var at0, atN *connRate
		for i := range r.Conns {
			c := &r.Conns[i]
			if c.Plugin == "ours" && c.Backend == be {
				if c.N == 0 {
					at0 = c
				} else {
					atN = c
				}
			}
		}
		if at0 != nil && atN != nil && at0.Ratio > 0 && atN.Ratio > 0 {
			rel := atN.Ratio / at0.Ratio
			add(fmt.Sprintf("%s data path: (host port ÷ direct) at N=%d ≥ 0.95× at N=0", be, atN.N), fmt.Sprintf("%.2f×", rel), rel >= 0.95)
		}
	}
	r.manyGoals(add)
	r.socketGoals(add)
	r.agentGoals(add)
	return rows
}

var agentHead = []string{"backend", "N", "agent RSS after 10 passes, between passes, MB (goal ≤ 30)", "peak (in a pass) MB", "idle CPU ms/min (passes)", "STATUS p50 ms", "STATUS after a flush (0) p50 ms"}

func (r *report) agentRows() [][]string {
	var rows [][]string
	for _, s := range r.Sync {
		a := s.Agent
		rows = append(rows, []string{s.Backend, fmt.Sprint(s.N), fmt.Sprintf("%.1f", float64(a.RSSKB)/1024), fmt.Sprintf("%.1f", float64(a.PeakKB)/1024),
			fmt.Sprintf("%.1f (%d in %.0f s)", a.IdleCPUPerMin, a.IdlePasses, a.IdleSeconds), fmt.Sprintf("%.1f", a.StatusP50), fmt.Sprintf("%.1f", a.StatusFlushedP50)})
	}
	return rows
}

// agentGoals are the agent's goals (issue #17): memory, and no pass
// while idle.
func (r *report) agentGoals(add func(goal, measured string, met bool)) {
	floor := 0.0
	for _, f := range r.Floor {
		if f.Plugin == "ours" {
			floor = f.P50
		}
	}
	for _, s := range r.Sync {
		st := s.Agent
		add(fmt.Sprintf("%s: STATUS at N=%d within 5 ms of the no-op start (%.1f ms)", s.Backend, s.N, floor),
			fmt.Sprintf("%.1f ms", st.StatusP50), st.StatusP50-floor <= 5)
		add(fmt.Sprintf("%s: STATUS after a flush (0) at N=%d within 5 ms of the no-op start", s.Backend, s.N),
			fmt.Sprintf("%.1f ms", st.StatusFlushedP50), st.StatusFlushedP50-floor <= 5)
	}
	for _, s := range r.Sync {
		a := s.Agent
		add(fmt.Sprintf("%s: agent RSS at N=%d after 10 passes ≤ 30 MB", s.Backend, s.N), fmt.Sprintf("%.1f MB", float64(a.RSSKB)/1024), a.RSSKB <= 30*1024)
		add(fmt.Sprintf("%s: agent idle at N=%d: no pass without an event or the interval", s.Backend, s.N),
			fmt.Sprintf("%d passes, %.1f ms CPU/min", a.IdlePasses, a.IdleCPUPerMin), a.IdlePasses == 0)
	}
}
