package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/portmap-dev/portmap/pkg/host"
	"github.com/portmap-dev/portmap/pkg/inventory"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// listMain is `portmap list [--json]`: the host-port table of this host
// from the kernel state of every backend and layer, both families,
// including what the upstream plugin made (same iptables layout).
func listMain(args []string) int {
	if err := list(os.Stdout, host.Real(os.Stderr), args); err != nil {
		fmt.Fprintln(os.Stderr, "portmap:", err)
		return 1
	}
	return 0
}

func list(w io.Writer, h *host.Host, args []string) error {
	const usage = "usage: portmap list [--json] [--bpf-pin-dir DIR]..."
	asJSON := false
	var sites []*plan.Request
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "--json", "-json":
			asJSON = true
		case "--bpf-pin-dir", "-bpf-pin-dir":
			if i+1 == len(args) {
				return fmt.Errorf("%s (%s needs a directory)", usage, a)
			}
			i++
			req, err := pinDirSite(args[i])
			if err != nil {
				return err
			}
			sites = append(sites, req)
		default:
			return fmt.Errorf("%s (unknown argument %q)", usage, a)
		}
	}
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

// writeTable prints entries as aligned columns.
func writeTable(w io.Writer, entries []inventory.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST IP\tHOST PORT\tPROTO\tCONTAINER IP\tCONTAINER PORT\tNETWORK\tCONTAINER ID\tBACKEND")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.HostIP, e.HostPort, e.Protocol, e.ContainerIP,
			strconv.Itoa(e.ContainerPort), e.Network, e.ContainerID, e.Backend)
	}
	return tw.Flush()
}
