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
	asJSON := false
	for _, a := range args {
		switch a {
		case "--json", "-json":
			asJSON = true
		default:
			return fmt.Errorf("usage: portmap list [--json] (unknown argument %q)", a)
		}
	}
	entries, err := inventory.Read(h)
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
