package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// listMain is `portmap list [--json] [--bpf-pin-dir DIR]...`: the
// host-port table of this host from the kernel state of every backend and
// layer, both families, including what the upstream plugin made (same
// iptables layout).
func (p Program) listMain(args []string) int {
	fs := p.newFlags("list", "[--json] [--bpf-pin-dir DIR]...",
		"Print this host's host-port table, read from the kernel: every backend and\n"+
			"layer, both families, the upstream plugin's rules too (same layout).")
	asJSON := fs.Bool("json", false, "print the entries as JSON")
	var pinDirs networks
	fs.Var(&pinDirs, "bpf-pin-dir", "also read the socket path pinned here (a \"bpfPinDir\" of a configuration; repeatable)")
	if code, done := p.parse(fs, args); done {
		return code
	}
	var sites []*plan.Request
	for _, d := range pinDirs {
		req, err := pinDirSite(d)
		if err != nil {
			fmt.Fprintln(p.Stderr, p.Name+" list:", err)
			return 2
		}
		sites = append(sites, req)
	}
	if err := list(p.Stdout, p.Host(p.Stderr), *asJSON, sites); err != nil {
		fmt.Fprintln(p.Stderr, p.Name+" list:", err)
		return 1
	}
	return 0
}

func list(w io.Writer, h *host.Host, asJSON bool, sites []*plan.Request) error {
	entries, err := inventory.Read(h, sites...)
	if entries == nil {
		entries = []inventory.Entry{}
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if e := enc.Encode(entries); e != nil {
			return e
		}
	} else if e := writeTable(w, entries); e != nil {
		return e
	}
	return err
}

// writeTable prints entries as aligned columns: each but the last as
// wide as its widest cell and two spaces (text/tabwriter's layout, in
// a few lines instead of its 8 KB).
func writeTable(w io.Writer, entries []inventory.Entry) error {
	rows := [][]string{{"HOST IP", "HOST PORT", "PROTO", "CONTAINER IP", "CONTAINER PORT", "NETWORK", "CONTAINER ID", "BACKEND"}}
	for _, e := range entries {
		rows = append(rows, []string{e.HostIP, strconv.Itoa(e.HostPort), e.Protocol, e.ContainerIP,
			strconv.Itoa(e.ContainerPort), e.Network, e.ContainerID, e.Backend})
	}
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
