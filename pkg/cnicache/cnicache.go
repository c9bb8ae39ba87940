// Package cnicache reads the attachments a runtime ADDed from libcni's
// result cache (<dir>/results/<network>-<containerID>-<ifname>, kind
// cniCacheV1), and rebuilds, for each one holding a portmap plugin, the
// configuration that plugin was given on ADD: its own keys from the cached
// network configuration list, name and cniVersion of the list,
// runtimeConfig from the cached capability arguments (only those the
// plugin declares), and prevResult from the cached result. containerd,
// CRI-O and Podman's CNI mode all go through libcni and write this cache.
package cnicache

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/portmap-dev/portmap/pkg/workers"
)

// DefaultDir is libcni's default cache directory (libcni.CacheDir).
const DefaultDir = "/var/lib/cni"

// kindV1 is the only cache format libcni writes (libcni.CNICacheV1; not
// imported: libcni brings net/http and TLS into a binary that needs
// neither, a third of its size).
const kindV1 = "cniCacheV1"

// Attachment is one cached attachment whose configuration list holds the
// plugin.
type Attachment struct {
	// File is the cache file's path.
	File    string
	ModTime time.Time
	// Stamp tells this version of the file from others (Reader).
	Stamp       Stamp
	Network     string
	ContainerID string
	IfName      string
	// NetNS is the container's namespace as the runtime named it on ADD
	// (libcni caches it since v1.1; "" before).
	NetNS string
	// Stdin is the plugin's configuration as the runtime passed it on ADD.
	Stdin []byte
}

// Skipped is a cache file that yields no attachment, and why.
type Skipped struct {
	File string
	Why  string
	// Corrupt is true when the file is not a usable cache entry (it does
	// not parse, is of an unknown kind, or lacks its owner); false when it
	// is a valid entry of a network without the plugin.
	Corrupt bool
}

// entry is libcni's cachedInfo, the fields read here.
type entry struct {
	Kind           string                     `json:"kind"`
	ContainerID    string                     `json:"containerId"`
	Config         []byte                     `json:"config"`
	IfName         string                     `json:"ifName"`
	NetworkName    string                     `json:"networkName"`
	NetNS          string                     `json:"netns,omitempty"`
	CapabilityArgs map[string]json.RawMessage `json:"capabilityArgs,omitempty"`
	RawResult      json.RawMessage            `json:"result,omitempty"`
}

// Read returns the cached attachments under dir whose configuration list
// holds a plugin of type pluginType, oldest first (by the cache file's
// modification time, which libcni writes on ADD), and the files it skipped.
// A cache directory that is not there (a wrong flag, a hostPath that
// mounts another directory, a wiped cache) or cannot be read is an error
// (ErrNoCache where it is not there), never an empty cache; a missing
// results directory inside it is one (libcni makes it at its first ADD).
func Read(dir, pluginType string) ([]Attachment, []Skipped, error) {
	return (&Reader{PluginType: pluginType}).Read(dir)
}

// Reader reads the cache as Read does, and keeps what it made of each
// file across its calls: a file whose identity (device and inode), size
// and modification time have not changed is not read or parsed again
// (the watch mode's passes; decoding every entry was half a pass's CPU
// at 1000 attachments). A Reader is for one goroutine at a time.
type Reader struct {
	PluginType string
	memo       map[string]memo // by file path
	// Parsed counts the files the last Read read and parsed.
	Parsed int
}

type memo struct {
	stamp   Stamp
	a       Attachment
	why     string
	corrupt bool
}

// Stamp is what tells one version of a cache file from another.
type Stamp struct {
	Dev, Ino uint64
	Size     int64
	ModTime  int64 // nanoseconds
}

func stampOf(fi os.FileInfo) Stamp {
	s := Stamp{Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.Dev, s.Ino = uint64(st.Dev), st.Ino
	}
	return s
}

// ErrNoCache is a cache directory that is not there.
var ErrNoCache = errors.New("no such cache directory")

// Read returns the cached attachments under dir, as the function Read.
func (r *Reader) Read(dir string) ([]Attachment, []Skipped, error) {
	pluginType := r.PluginType
	if fi, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("read cache %s: %w", dir, ErrNoCache)
	} else if err != nil {
		return nil, nil, fmt.Errorf("read cache: %w", err)
	} else if !fi.IsDir() {
		return nil, nil, fmt.Errorf("read cache %s: not a directory", dir)
	}
	results := filepath.Join(dir, "results")
	des, err := os.ReadDir(results)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read cache: %w", err)
	}
	// Files are read and parsed by one worker per core; a node's entries
	// of one network share their configuration list, parsed once.
	type one struct {
		a       Attachment
		why     string
		corrupt bool
	}
	var files []string
	for _, de := range des {
		if !de.IsDir() {
			files = append(files, filepath.Join(results, de.Name()))
		}
	}
	res := make([]one, len(files))
	stamps := make([]Stamp, len(files))
	parsed := make([]bool, len(files))
	lists := &listCache{m: map[string]*parsedList{}}
	workers.Each(len(files), func(i int) {
		o := &res[i]
		fi, err := os.Stat(files[i])
		if err != nil {
			o.why, o.corrupt = err.Error(), true
			return
		}
		stamps[i] = stampOf(fi)
		if m, ok := r.memo[files[i]]; ok && m.stamp == stamps[i] {
			o.a, o.why, o.corrupt = m.a, m.why, m.corrupt
			return
		}
		parsed[i] = true
		o.a, o.why, o.corrupt = readOne(files[i], fi, pluginType, lists)
	})
	r.memo, r.Parsed = make(map[string]memo, len(files)), 0
	for i, o := range res {
		if parsed[i] {
			r.Parsed++
		}
		if stamps[i] != (Stamp{}) {
			r.memo[files[i]] = memo{stamps[i], o.a, o.why, o.corrupt}
		}
	}
	var out []Attachment
	var skipped []Skipped
	for i, r := range res {
		if r.why != "" {
			skipped = append(skipped, Skipped{File: files[i], Why: r.why, Corrupt: r.corrupt})
			continue
		}
		out = append(out, r.a)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].ModTime.Equal(out[j].ModTime) {
			return out[i].ModTime.Before(out[j].ModTime)
		}
		return out[i].File < out[j].File
	})
	return out, skipped, nil
}

// readOne reads one cache file; why is non-empty when it yields nothing.
func readOne(file string, fi os.FileInfo, pluginType string, lists *listCache) (a Attachment, why string, corrupt bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		return a, err.Error(), true
	}
	var e entry
	if err := json.Unmarshal(data, &e); err != nil {
		return a, fmt.Sprintf("not a cache entry: %v", err), true
	}
	if e.Kind != kindV1 {
		return a, fmt.Sprintf("unknown cache kind %q (want %q)", e.Kind, kindV1), true
	}
	if e.NetworkName == "" || e.ContainerID == "" || e.IfName == "" {
		return a, "cache entry without network name, container ID or interface name", true
	}
	stdin, err := lists.pluginConfig(e.Config, pluginType, e.CapabilityArgs, e.RawResult)
	if errors.Is(err, errNoPlugin) {
		return a, err.Error(), false
	}
	if err != nil {
		return a, err.Error(), true
	}
	return Attachment{
		File: file, ModTime: fi.ModTime(), Stamp: stampOf(fi),
		Network: e.NetworkName, ContainerID: e.ContainerID, IfName: e.IfName,
		NetNS: e.NetNS, Stdin: stdin,
	}, "", false
}

var errNoPlugin = errors.New("no portmap plugin in the network configuration")

// parsedList is the part of a configuration list pluginConfig needs.
type parsedList struct {
	name, cniVersion string
	keys             map[string]json.RawMessage // the plugin's own keys
	capabilities     map[string]bool
	err              error
}

// listCache parses each distinct configuration list once.
type listCache struct {
	mu sync.Mutex
	m  map[string]*parsedList
}

func (c *listCache) parse(conflist []byte, pluginType string) *parsedList {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := pluginType + "\x00" + string(conflist)
	if pl, ok := c.m[key]; ok {
		return pl
	}
	pl := parseList(conflist, pluginType)
	c.m[key] = pl
	return pl
}

func parseList(conflist []byte, pluginType string) *parsedList {
	if len(conflist) == 0 {
		return &parsedList{err: errors.New("cache entry without a network configuration")}
	}
	// The cached configuration is a list ({"plugins": [...]}) or, from a
	// runtime that ran one plugin (AddNetwork), that plugin's own.
	var list struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(conflist, &list); err != nil {
		return &parsedList{err: fmt.Errorf("cached network configuration: %w", err)}
	}
	if list.Name == "" {
		return &parsedList{err: errors.New("cached network configuration: no name")}
	}
	plugins := list.Plugins
	if plugins == nil {
		plugins = []json.RawMessage{conflist}
	}
	for i, raw := range plugins {
		var pc struct {
			Type         string          `json:"type"`
			Capabilities map[string]bool `json:"capabilities"`
		}
		if err := json.Unmarshal(raw, &pc); err != nil {
			return &parsedList{err: fmt.Errorf("cached network configuration: plugins[%d]: %w", i, err)}
		}
		if pc.Type != pluginType {
			continue
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			return &parsedList{err: fmt.Errorf("cached %s configuration: %w", pluginType, err)}
		}
		return &parsedList{name: list.Name, cniVersion: list.CNIVersion, keys: keys, capabilities: pc.Capabilities}
	}
	return &parsedList{err: errNoPlugin}
}

func (c *listCache) pluginConfig(conflist []byte, pluginType string, capArgs map[string]json.RawMessage, result json.RawMessage) ([]byte, error) {
	pl := c.parse(conflist, pluginType)
	if pl.err != nil {
		return nil, pl.err
	}
	conf := make(map[string]json.RawMessage, len(pl.keys)+4)
	for k, v := range pl.keys {
		conf[k] = v
	}
	var err error
	if conf["name"], err = json.Marshal(pl.name); err != nil {
		return nil, err
	}
	if conf["cniVersion"], err = json.Marshal(pl.cniVersion); err != nil {
		return nil, err
	}
	if len(result) > 0 && string(result) != "null" {
		conf["prevResult"] = result
	}
	rc := map[string]json.RawMessage{}
	for capability, on := range pl.capabilities {
		if v, ok := capArgs[capability]; ok && on {
			rc[capability] = v
		}
	}
	if len(rc) > 0 {
		if conf["runtimeConfig"], err = json.Marshal(rc); err != nil {
			return nil, err
		}
	}
	return json.Marshal(conf)
}

// Entry is what Write caches, in libcni's format: the network
// configuration list, the capability arguments and the final result.
type Entry struct {
	Network, ContainerID, IfName string
	NetNS                        string
	Conflist                     []byte
	CapabilityArgs               map[string]any
	Result                       map[string]any
}

// Write caches e under dir as libcni does after ADD (for tests and the
// benchmark, which make attachments without a runtime).
func Write(dir string, e Entry) error {
	data, err := json.Marshal(struct {
		entry
		CapabilityArgs map[string]any `json:"capabilityArgs,omitempty"`
		RawResult      map[string]any `json:"result,omitempty"`
	}{entry{Kind: kindV1, ContainerID: e.ContainerID, Config: e.Conflist, IfName: e.IfName, NetworkName: e.Network, NetNS: e.NetNS},
		e.CapabilityArgs, e.Result})
	if err != nil {
		return err
	}
	results := filepath.Join(dir, "results")
	if err := os.MkdirAll(results, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(results, e.Network+"-"+e.ContainerID+"-"+e.IfName), data, 0o600)
}
