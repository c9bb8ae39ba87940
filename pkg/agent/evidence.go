package agent

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/portmap-dev/portmap/pkg/cnicache"
)

// evidence is what a pass's read of the cache can show gone. An object
// no cached attachment owns is an orphan only when the cache speaks for
// its owner: none of its files that could be the owner's failed to read
// (an entry cut short, unreadable, with a configuration ADD would
// refuse), and it holds entries of the owner's network (the runtime
// caches that network here: a cache wiped by hand, another runtime's
// directory, or Multus's, whose entries name only itself, hold none) or
// of the owner's container on other networks (a network renamed). The
// ledger speaks for an owner too: its ADD on record, its namespace gone
// (admission.dead).
// Objects that name no owner (a CNI-DN chain whose jump is gone or does
// not parse) have no cache entry that could show them gone, and stay.
type evidence struct {
	dir string
	// networks are those the cache holds a readable portmap entry of.
	networks map[string]bool
	// containers are the container IDs the cache holds an entry of.
	containers map[string]bool
	// unusable are the base names of the cache files that yield no
	// attachment through a fault, with why: libcni names each
	// <network>-<containerID>-<ifname>, so a file names its owner even
	// when its content cannot be read.
	unusable map[string]string
}

// missing says why the cache cannot show the owner (network, container
// ID; "" where the objects do not name it) gone, or "" when it can.
func (e *evidence) missing(network, id string) string {
	if id == "" {
		return "it names no owner, so no cache entry can show it gone"
	}
	for _, name := range slices.Sorted(maps.Keys(e.unusable)) {
		if (network != "" && strings.HasPrefix(name, network+"-"+id+"-")) || (network == "" && strings.Contains(name, "-"+id+"-")) {
			return fmt.Sprintf("its cache entry %s may be the one that cannot be used (%s)", name, e.unusable[name])
		}
	}
	switch {
	case e.containers[id]:
		return "" // the runtime caches the container on other networks only
	case network != "" && !e.networks[network]:
		return fmt.Sprintf("%s holds no entry of network %q: nothing there shows this network's attachments gone", e.dir, network)
	case network == "" && len(e.networks) == 0:
		return fmt.Sprintf("%s holds no portmap entry: nothing there shows an attachment gone", e.dir)
	}
	return ""
}

// evidenceOf is what the cache read of dir can show gone: its portmap
// entries (atts) and the files the pass skipped for a fault (those of
// its report's Skipped that are errors: files that are no cache entry,
// entries without a result or with a configuration ADD refuses).
func evidenceOf(dir string, atts []cnicache.Attachment, skipped []Skipped) *evidence {
	e := &evidence{dir: dir, networks: map[string]bool{}, containers: map[string]bool{}, unusable: map[string]string{}}
	for _, at := range atts {
		e.networks[at.Network], e.containers[at.ContainerID] = true, true
	}
	for _, s := range skipped {
		if s.Error {
			e.unusable[filepath.Base(s.File)] = s.Why
		}
	}
	return e
}
