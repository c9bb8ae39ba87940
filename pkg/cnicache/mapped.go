package cnicache

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Mapped finds in the cache under dir an attachment of network that was
// given port mappings (the portMappings capability argument) and holds an
// address of a family in fams (4, 6) in its result; it returns the
// attachment's file, or "" when there is none. It reads only the
// network's files (libcni names them <network>-<containerID>-<ifname>),
// and only until the first one that matches: STATUS asks it when the
// shared rules are missing, to tell a node whose attachments lost their
// host ports from one that has none.
func Mapped(dir, network string, fams map[int]bool) (string, error) {
	results := filepath.Join(dir, "results")
	des, err := os.ReadDir(results)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read cache: %w", err)
	}
	for _, de := range des {
		if de.IsDir() || !strings.HasPrefix(de.Name(), network+"-") {
			continue
		}
		file := filepath.Join(results, de.Name())
		if mappedEntry(file, network, fams) {
			return file, nil
		}
	}
	return "", nil
}

// mappedEntry reports whether file is a cache entry of network with port
// mappings and an address of a family in fams; a file that cannot be read
// or parsed is not one (the agent reports those).
func mappedEntry(file, network string, fams map[int]bool) bool {
	data, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	var e struct {
		Kind           string `json:"kind"`
		NetworkName    string `json:"networkName"`
		CapabilityArgs struct {
			PortMappings []json.RawMessage `json:"portMappings"`
		} `json:"capabilityArgs"`
		Result struct {
			IPs []struct {
				Address string `json:"address"`
			} `json:"ips"`
		} `json:"result"`
	}
	if json.Unmarshal(data, &e) != nil || e.Kind != kindV1 || e.NetworkName != network || len(e.CapabilityArgs.PortMappings) == 0 {
		return false
	}
	for _, ip := range e.Result.IPs {
		a, _, err := net.ParseCIDR(ip.Address)
		if err != nil {
			continue
		}
		fam := 6
		if a.To4() != nil {
			fam = 4
		}
		if fams[fam] {
			return true
		}
	}
	return false
}

// Cached reports whether dir holds libcni's cache entry of the
// attachment (network, containerID, ifName): one stat of
// <dir>/results/<network>-<containerID>-<ifName>.
func Cached(dir, network, containerID, ifName string) bool {
	_, err := os.Stat(filepath.Join(dir, "results", network+"-"+containerID+"-"+ifName))
	return err == nil
}
