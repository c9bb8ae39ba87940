package portmap

import (
	"bytes"
	"encoding/json"
	"io"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/portmap-dev/portmap/pkg/attach"
	"github.com/portmap-dev/portmap/pkg/stdinpipe"
)

// Serve answers a runtime's CNI call through skel's dispatch (its
// environment checks, version checks and error output), reading the
// request once: for ADD, CHECK and DEL, whose requests carry the port
// mappings (a Podman range sends thousands: 300 KB of JSON for 5000
// ports), the configuration is decoded here, and skel is handed only
// the two keys it reads of it, cniVersion and name — it would otherwise
// scan every byte two or three times more. A request this decoding
// refuses reaches skel as it came, so every error is answered as before:
// skel's checks first, then the verb's.
func (p *Plugin) Serve(info version.PluginInfo, about string) {
	switch os.Getenv("CNI_COMMAND") {
	case "ADD", "CHECK", "DEL":
		if stdin, err := readAll(os.Stdin); err == nil {
			os.Stdin = p.preparse(stdin, os.Getenv("CNI_IFNAME"))
		}
	}
	skel.PluginMainFuncs(p.Funcs(), info, about)
}

// preparse decodes a request and returns what skel reads in its place:
// the request's cniVersion and name (kept, with the configuration, for
// the verb), or the request itself when it does not decode.
func (p *Plugin) preparse(stdin []byte, ifName string) *os.File {
	forSkel := stdin
	if c, err := attach.Parse(stdin, ifName, p.Host.DefaultBackend()); err == nil {
		brief, err := json.Marshal(struct {
			CNIVersion string `json:"cniVersion,omitempty"`
			Name       string `json:"name"`
		}{c.CNIVersion, c.Network})
		if err == nil {
			p.decoded, p.brief, forSkel = c, brief, brief
		}
	}
	return pipeOf(forSkel)
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

// decodedFor returns the configuration Serve decoded, if stdin is what it
// handed skel in the request's place.
func (p *Plugin) decodedFor(stdin []byte) *attach.Config {
	if p.decoded == nil || !bytes.Equal(stdin, p.brief) {
		return nil
	}
	c := p.decoded
	p.decoded, p.brief = nil, nil
	return c
}

// readAll reads r to its end into one buffer whose capacity is reserved
// up front: memory a process has not touched costs nothing, and a 300 KB
// request then touches its own pages once, where io.ReadAll's doubling
// would touch some 600 KB more on the way (each page a fault).
//
// A request that fills a pipe's 64 KiB comes in rounds, each waiting for
// the runtime's writer to be scheduled again: main widens a full pipe as
// the program starts (stdinpipe.Widen), and one that the first read
// finds full is given room for the rest here (F_SETPIPE_SZ, which wakes
// the writer).
func readAll(r io.Reader) ([]byte, error) {
	b := make([]byte, 0, 1<<20)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		if len(b) == 0 && n >= 64<<10 && err == nil {
			if f, ok := r.(*os.File); ok {
				stdinpipe.Grow(int(f.Fd())) // not a pipe, or refused: rounds it is
			}
		}
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
