package cli

import (
	"encoding/json"
	"errors"
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
	if err := list(p.Stdout, p.Stderr, a.Host(p.Stderr), *asJSON, sites); err != nil {
		fmt.Fprintln(p.Stderr, p.Name+" list:", err)
		return 1
	}
	return 0
}

// listed is one entry of the list, with what drops it.
type listed struct {
	inventory.Entry
	// DroppedBy names the firewall setting that drops the host port's
	// connections, from other hosts and the node alike: firewalld's
	// StrictForwardPorts, for the DNAT backends' entries.
	DroppedBy string `json:"droppedBy,omitempty"`
}

// strictNote is the DroppedBy of firewalld's StrictForwardPorts.
const strictNote = "firewalld StrictForwardPorts"

func list(w, notes io.Writer, h *host.Host, asJSON bool, sites []*plan.Request) error {
	entries, err := inventory.Read(h, sites...)
	dropped, serr := droppedByFirewall(h)
	out := make([]listed, len(entries))
	for i, e := range entries {
		out[i].Entry = e
		if dropped[e.Backend] {
			out[i].DroppedBy = strictNote
		}
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if e := enc.Encode(out); e != nil {
			return e
		}
	} else if e := writeTable(w, out); e != nil {
		return e
	}
	if len(dropped) > 0 {
		fmt.Fprintln(notes, "firewalld's StrictForwardPorts is on: it drops connections to the host ports of the",
			"iptables and nftables backends (DROPPED BY), unless a firewalld forward port or policy lets them through")
	}
	return errors.Join(err, serr)
}

// droppedByFirewall names the backends whose host ports the firewall
// manager drops: the DNAT backends (not the socket path's layer, which
// connects the node's own sockets without DNAT) where firewalld's
// StrictForwardPorts is on.
func droppedByFirewall(h *host.Host) (map[string]bool, error) {
	if h.StrictForwardPorts == nil {
		return nil, nil
	}
	strict, _, err := h.StrictForwardPorts()
	if err != nil || !strict {
		return nil, err
	}
	dropped := map[string]bool{}
	for _, k := range h.Kinds {
		dropped[string(k.Name)] = true
	}
	return dropped, nil
}

// writeTable prints entries as aligned columns, two spaces apart; with a
// DROPPED BY column where any is dropped.
func writeTable(w io.Writer, entries []listed) error {
	drops := false
	for _, e := range entries {
		drops = drops || e.DroppedBy != ""
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "HOST IP\tHOST PORT\tPROTO\tCONTAINER IP\tCONTAINER PORT\tNETWORK\tCONTAINER ID\tBACKEND"
	if drops {
		head += "\tDROPPED BY"
	}
	fmt.Fprintln(tw, head)
	for _, e := range entries {
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s", e.HostIP, e.HostPort, e.Protocol, e.ContainerIP,
			e.ContainerPort, e.Network, e.ContainerID, e.Backend)
		if drops && e.DroppedBy == "" {
			line += "\t-"
		} else if drops {
			line += "\t" + e.DroppedBy
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}
