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
	"time"

	"github.com/containernetworking/cni/libcni"
)

// DefaultDir is libcni's default cache directory (libcni.CacheDir).
const DefaultDir = "/var/lib/cni"

// kindV1 is the only cache format libcni writes.
const kindV1 = libcni.CNICacheV1

// Attachment is one cached attachment whose configuration list holds the
// plugin.
type Attachment struct {
	// File is the cache file's path.
	File        string
	ModTime     time.Time
	Network     string
	ContainerID string
	IfName      string
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
	Kind           string         `json:"kind"`
	ContainerID    string         `json:"containerId"`
	Config         []byte         `json:"config"`
	IfName         string         `json:"ifName"`
	NetworkName    string         `json:"networkName"`
	CapabilityArgs map[string]any `json:"capabilityArgs,omitempty"`
	RawResult      map[string]any `json:"result,omitempty"`
}

// Read returns the cached attachments under dir whose configuration list
// holds a plugin of type pluginType, oldest first (by the cache file's
// modification time, which libcni writes on ADD), and the files it skipped.
// A missing results directory is an empty cache.
func Read(dir, pluginType string) ([]Attachment, []Skipped, error) {
	results := filepath.Join(dir, "results")
	des, err := os.ReadDir(results)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read cache: %w", err)
	}
	var out []Attachment
	var skipped []Skipped
	for _, de := range des {
		if de.IsDir() {
			continue
		}
		file := filepath.Join(results, de.Name())
		a, why, corrupt := readOne(file, pluginType)
		if why != "" {
			skipped = append(skipped, Skipped{File: file, Why: why, Corrupt: corrupt})
			continue
		}
		out = append(out, a)
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
func readOne(file, pluginType string) (a Attachment, why string, corrupt bool) {
	fi, err := os.Stat(file)
	if err != nil {
		return a, err.Error(), true
	}
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
	stdin, err := PluginConfig(e.Config, pluginType, e.CapabilityArgs, e.RawResult)
	if errors.Is(err, errNoPlugin) {
		return a, err.Error(), false
	}
	if err != nil {
		return a, err.Error(), true
	}
	return Attachment{
		File: file, ModTime: fi.ModTime(),
		Network: e.NetworkName, ContainerID: e.ContainerID, IfName: e.IfName,
		Stdin: stdin,
	}, "", false
}

var errNoPlugin = errors.New("no portmap plugin in the network configuration")

// PluginConfig rebuilds what libcni passes on stdin to the first plugin of
// type pluginType in the configuration list conflist: the plugin's keys
// with the list's name and cniVersion, runtimeConfig holding the
// capability arguments the plugin declares, and prevResult (when result
// is not nil).
func PluginConfig(conflist []byte, pluginType string, capArgs map[string]any, result map[string]any) ([]byte, error) {
	if len(conflist) == 0 {
		return nil, errors.New("cache entry without a network configuration")
	}
	list, err := libcni.NetworkConfFromBytes(conflist)
	if err != nil {
		return nil, fmt.Errorf("cached network configuration: %w", err)
	}
	if len(list.Plugins) == 0 {
		// A runtime that ran one plugin (AddNetwork) cached its config.
		pc, err := libcni.ConfFromBytes(conflist)
		if err != nil {
			return nil, fmt.Errorf("cached network configuration: %w", err)
		}
		list.Plugins = []*libcni.PluginConfig{pc}
	}
	for _, pc := range list.Plugins {
		if pc.Network.Type != pluginType {
			continue
		}
		inject := map[string]any{"name": list.Name, "cniVersion": list.CNIVersion}
		if result != nil {
			inject["prevResult"] = result
		}
		rc := map[string]any{}
		for capability, on := range pc.Network.Capabilities {
			if v, ok := capArgs[capability]; ok && on {
				rc[capability] = v
			}
		}
		if len(rc) > 0 {
			inject["runtimeConfig"] = rc
		}
		conf, err := libcni.InjectConf(pc, inject)
		if err != nil {
			return nil, fmt.Errorf("build %s configuration: %w", pluginType, err)
		}
		return conf.Bytes, nil
	}
	return nil, errNoPlugin
}

// Entry is what Write caches, in libcni's format: the network
// configuration list, the capability arguments and the final result.
type Entry struct {
	Network, ContainerID, IfName string
	Conflist                     []byte
	CapabilityArgs               map[string]any
	Result                       map[string]any
}

// Write caches e under dir as libcni does after ADD (for tests and the
// benchmark, which make attachments without a runtime).
func Write(dir string, e Entry) error {
	data, err := json.Marshal(entry{Kind: kindV1, ContainerID: e.ContainerID, Config: e.Conflist, IfName: e.IfName,
		NetworkName: e.Network, CapabilityArgs: e.CapabilityArgs, RawResult: e.Result})
	if err != nil {
		return err
	}
	results := filepath.Join(dir, "results")
	if err := os.MkdirAll(results, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(results, e.Network+"-"+e.ContainerID+"-"+e.IfName), data, 0o600)
}
