package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/portmap-dev/portmap/pkg/cmdline"
	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// listMain is `portmap-agent list [--json] [--bpf-pin-dir DIR]...`: the
// host-port table of this host from the kernel state of every backend and
// layer, both families, including what the upstream plugin made (same
// iptables layout).
func (a Agent) listMain(p cmdline.Program, args []string) int {
	fs := p.Flags("list", "[--json] [--bpf-pin-dir DIR]...",
		"Print this host's host-port table, read from the kernel: every backend and\n"+
			"layer, both families, the upstream plugin's rules too (same layout).")
	asJSON := fs.Bool("json", false, "print the entries as JSON")
	var pinDirs networks
	fs.Var(&pinDirs, "bpf-pin-dir", "also read the socket path pinned here (a \"bpfPinDir\" of a configuration; repeatable)")
	if code, done := p.Parse(fs, args); done {
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
	if err := list(p.Stdout, a.Host(p.Stderr), *asJSON, sites); err != nil {
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

// writeTable prints entries as aligned columns, two spaces apart.
func writeTable(w io.Writer, entries []inventory.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST IP\tHOST PORT\tPROTO\tCONTAINER IP\tCONTAINER PORT\tNETWORK\tCONTAINER ID\tBACKEND")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", e.HostIP, e.HostPort, e.Protocol, e.ContainerIP,
			e.ContainerPort, e.Network, e.ContainerID, e.Backend)
	}
	return tw.Flush()
}
