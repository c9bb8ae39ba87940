package portmap

import (
	"encoding/json"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/deadline"
	"github.com/portmap-dev/portmap/pkg/stdinpipe"
)

// Serve answers a runtime's CNI call through skel's dispatch (its
// environment checks, version checks and error output), reading the
// request once: for ADD, CHECK and DEL, whose requests carry the port
// mappings (a Podman range sends thousands: 330 KB of JSON for 5000
// ports), the configuration is decoded here, as stdin is read
// (attach.Read), and skel is handed only the two keys it reads of it,
// cniVersion and name — it would otherwise scan every byte two or three
// times more. A request this decoding refuses reaches skel as it came,
// so every error is answered as before: skel's checks first, then the
// verb's.
func (p *Plugin) Serve(info version.PluginInfo, about string) {
	switch os.Getenv("CNI_COMMAND") {
	case "ADD", "CHECK", "DEL":
		os.Stdin = p.preparse(stdinpipe.Reader(os.Stdin), os.Getenv("CNI_IFNAME"))
	}
	skel.PluginMainFuncs(p.Funcs(), info, about)
}

// preparse reads and decodes a request and returns what skel reads in
// its place: the request's cniVersion and name (kept, with the
// configuration, for the verb), or the request itself when it does not
// decode.
func (p *Plugin) preparse(stdin io.Reader, ifName string) *os.File {
	c, sent, err := attach.Read(stdin, ifName, p.Host.DefaultBackend())
	if err != nil {
		return pipeOf(sent)
	}
	// two strings: Marshal cannot fail
	brief, _ := json.Marshal(struct {
		CNIVersion string `json:"cniVersion,omitempty"`
		Name       string `json:"name"`
	}{c.CNIVersion, c.Network})
	p.decoded, p.brief = c, brief
	return pipeOf(brief)
}

// pipeOf is a file that reads b (written by a goroutine: a pipe holds
// 64 KB).
func pipeOf(b []byte) *os.File {
	r, w, err := os.Pipe()
	if err != nil {
		return os.Stdin // spent: skel reads nothing and says so
	}
	go func() {
		_, _ = w.Write(b)
		_ = w.Close()
	}()
	return r
}

// Funcs are the verbs for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: inTime(p.Add), Del: inTime(p.Del), Check: inTime(p.Check), GC: inTime(p.GC), Status: inTime(p.Status)}
}

// inTime runs verb within one deadline (deadline.Verb): its waits for
// the host lock and the tools it runs share it.
func inTime(verb func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		defer deadline.Set(deadline.Verb)()
		return verb(args)
	}
}
