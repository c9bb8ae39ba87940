package nettest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
)

// Net describes a conflist: a main plugin (ptp or bridge) with host-local
// IPAM, then a portmap plugin.
type Net struct {
	Name       string
	CNIVersion string // default 1.0.0
	Main       string // "ptp" (default) or "bridge"
	Bridge     string // bridge name, with Main "bridge"
	// NoMasq turns the main plugin's ipMasq off: its iptables calls wait
	// for the xtables lock without a bound (go-iptables' bare --wait).
	NoMasq bool
	V4, V6 string // container subnets; V6 may be empty
	// Portmap is the portmap plugin's type: "portmap" (ours, default) or
	// "portmap-upstream".
	Portmap string
	// Extra are more keys of the portmap plugin, as raw JSON values.
	Extra map[string]string
	// DataDir is host-local's state directory; NewRuntime makes one.
	DataDir string
}

// Conflist renders the network configuration list.
func (n Net) Conflist() []byte {
	if n.CNIVersion == "" {
		n.CNIVersion = "1.0.0"
	}
	if n.Portmap == "" {
		n.Portmap = "portmap"
	}
	ranges := []string{fmt.Sprintf(`[{"subnet":%q}]`, n.V4)}
	routes := []string{`{"dst":"0.0.0.0/0"}`}
	if n.V6 != "" {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet":%q}]`, n.V6))
		routes = append(routes, `{"dst":"::/0"}`)
	}
	masq := !n.NoMasq
	main := fmt.Sprintf(`"type":"ptp","ipMasq":%v`, masq)
	if n.Main == "bridge" {
		main = fmt.Sprintf(`"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":%v,"hairpinMode":true`, n.Bridge, masq)
	}
	pm := []string{fmt.Sprintf(`"type":%q`, n.Portmap), `"capabilities":{"portMappings":true}`}
	for k, v := range n.Extra {
		pm = append(pm, fmt.Sprintf("%q:%s", k, v))
	}
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[
  {%s,"ipam":{"type":"host-local","dataDir":%q,"ranges":[%s],"routes":[%s]}},
  {%s}]}`, n.CNIVersion, n.Name, main, n.DataDir, strings.Join(ranges, ","), strings.Join(routes, ","), strings.Join(pm, ",")))
}

// Mapping is one entry of the portMappings capability.
type Mapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

// Runtime drives a conflist through libcni, as container runtimes do.
type Runtime struct {
	CNI  *libcni.CNIConfig
	List *libcni.NetworkConfigList
	// CacheDir is libcni's cache directory (results/ holds what ADD
	// cached).
	CacheDir string
}

// NewRuntime parses the conflist; plugins come from BinDir.
func NewRuntime(tb TB, n Net) *Runtime {
	tb.Helper()
	return NewRuntimeWithCache(tb, n, tb.TempDir())
}

// NewRuntimeWithCache is NewRuntime with libcni's cache in cacheDir, which
// runtimes of several networks on one node share.
func NewRuntimeWithCache(tb TB, n Net, cacheDir string) *Runtime {
	tb.Helper()
	if n.DataDir == "" {
		n.DataDir = tb.TempDir()
	}
	list, err := libcni.ConfListFromBytes(n.Conflist())
	if err != nil {
		tb.Fatalf("conflist: %v\n%s", err, n.Conflist())
	}
	return &Runtime{
		CNI:      libcni.NewCNIConfigWithCacheDir([]string{BinDir()}, cacheDir, nil),
		List:     list,
		CacheDir: cacheDir,
	}
}

// WithList returns a runtime that shares r's result cache but runs another
// conflist of the same network (to switch plugins under a container).
func (r *Runtime) WithList(tb TB, n Net) *Runtime {
	tb.Helper()
	list, err := libcni.ConfListFromBytes(n.Conflist())
	if err != nil {
		tb.Fatalf("conflist: %v", err)
	}
	return &Runtime{CNI: r.CNI, List: list, CacheDir: r.CacheDir}
}

// Container is one attachment made by a Runtime.
type Container struct {
	ID     string
	NS     ns.NetNS
	RT     *libcni.RuntimeConf
	Result *current.Result
}

// IP returns the container's first address of family 4 or 6.
func (c *Container) IP(family int) string {
	for _, ip := range c.Result.IPs {
		if (ip.Address.IP.To4() != nil) == (family == 4) {
			return ip.Address.IP.String()
		}
	}
	return ""
}

// Add creates a namespace and runs ADD for it with the mappings.
func (r *Runtime) Add(tb TB, id string, mappings ...Mapping) (*Container, error) {
	tb.Helper()
	c := &Container{ID: id, NS: NewNS(tb)}
	caps := map[string]any{}
	if len(mappings) > 0 {
		caps["portMappings"] = mappings
	}
	c.RT = &libcni.RuntimeConf{ContainerID: id, NetNS: c.NS.Path(), IfName: "eth0", CapabilityArgs: caps}
	res, err := r.CNI.AddNetworkList(context.Background(), r.List, c.RT)
	if err != nil {
		return c, err
	}
	if c.Result, err = current.NewResultFromResult(res); err != nil {
		return c, err
	}
	return c, nil
}

// MustAdd is Add that fails the test on error and runs DEL at cleanup.
func (r *Runtime) MustAdd(tb TB, id string, mappings ...Mapping) *Container {
	tb.Helper()
	c, err := r.Add(tb, id, mappings...)
	if err != nil {
		tb.Fatalf("ADD %s: %v", id, err)
	}
	tb.Cleanup(func() { _ = r.Del(c) })
	return c
}

// Del runs DEL with the cached result, as a runtime does on stop.
func (r *Runtime) Del(c *Container) error {
	return r.CNI.DelNetworkList(context.Background(), r.List, c.RT)
}

// Check runs CHECK.
func (r *Runtime) Check(c *Container) error {
	return r.CNI.CheckNetworkList(context.Background(), r.List, c.RT)
}

// Code returns the CNI error code of err (libcni wraps the plugin's), or
// 0.
func Code(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// Exec runs one plugin binary from BinDir with a raw configuration, as
// cnitool does, and returns its stdout.
func Exec(tb TB, plugin, command, containerID, netns string, conf any) ([]byte, error) {
	tb.Helper()
	b, err := json.Marshal(conf)
	if err != nil {
		tb.Fatal(err)
	}
	return execPlugin(plugin, command, containerID, netns, b)
}

// ExecPortmap runs the conflist's last plugin (portmap) alone for c, with
// the prevResult and mappings a runtime would pass, and returns its stdout.
// It is how a test re-runs one plugin without re-running IPAM.
func (r *Runtime) ExecPortmap(tb TB, c *Container, command string) ([]byte, error) {
	tb.Helper()
	last := r.List.Plugins[len(r.List.Plugins)-1]
	var conf map[string]any
	if err := json.Unmarshal(last.Bytes, &conf); err != nil {
		tb.Fatal(err)
	}
	conf["name"], conf["cniVersion"] = r.List.Name, r.List.CNIVersion
	if pm, ok := c.RT.CapabilityArgs["portMappings"]; ok {
		conf["runtimeConfig"] = map[string]any{"portMappings": pm}
	}
	if c.Result != nil {
		res, err := c.Result.GetAsVersion(r.List.CNIVersion)
		if err != nil {
			tb.Fatal(err)
		}
		conf["prevResult"] = res
	}
	return Exec(tb, last.Network.Type, command, c.ID, c.NS.Path(), conf)
}

// PortmapConf is the stdin a runtime gives the portmap plugin of network
// (backend "" leaves the key out): the mappings, and a prevResult naming
// addrs (CIDRs) on eth0 of sandbox "/x". The one config builder of the
// tests that run the plugin binary without libcni.
func PortmapConf(network, backend string, mappings []Mapping, addrs ...string) map[string]any {
	c := map[string]any{"cniVersion": "1.0.0", "name": network, "type": "portmap",
		"runtimeConfig": map[string]any{"portMappings": mappings}}
	if backend != "" {
		c["backend"] = backend
	}
	if len(addrs) > 0 {
		var ips []map[string]any
		for _, a := range addrs {
			ips = append(ips, map[string]any{"address": a, "interface": 0})
		}
		c["prevResult"] = map[string]any{"cniVersion": "1.0.0",
			"interfaces": []map[string]any{{"name": "eth0", "sandbox": "/x"}}, "ips": ips}
	}
	return c
}
