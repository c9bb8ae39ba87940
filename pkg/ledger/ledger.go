// Package ledger keeps, per attachment, what the plugin last began for it
// on this node: what the node agent must know, under the host-wide lock,
// before it writes or removes anything of that attachment.
//
// libcni writes its cache entry after the plugin's ADD has returned and
// removes it after DEL has returned, so a pass that read the cache a
// moment earlier holds a stale picture:
//
//	agent:   read cache (c1 cached) ........................ lock, repair c1  ← c1 is back
//	runtime:                 DEL c1 (lock, remove c1's rules), remove the cache entry
//
// Once c1's address is given to another container, c1's host port leads
// into that container. The ledger closes the race. Every ADD records the
// attachment (a fingerprint of what it maps, the container's namespace)
// before it writes a rule; DEL forgets the record before it removes one;
// both under the host-wide lock, which a pass holds while it reads the
// ledger and writes, so what it decides there is true when it writes:
//
//   - a cached attachment without a record, whose cache entry is younger
//     than the ledger (its Epoch), is one whose DEL has begun: it is never
//     repaired. An entry older than the ledger was written before this
//     node's plugin kept one; DEL of such an attachment leaves a Del record
//     while its cache entry is there, so it is not repaired either.
//   - a record whose fingerprint differs from the cache entry's plans says
//     the entry predates a re-ADD of the owner: the pass waits for the
//     runtime's new entry;
//   - the objects of a recorded owner whose namespace is alive, and which
//     the runtime caches on no other network, are never pruned, however
//     late the runtime writes its cache entry.
//
// The records live in a tmpfs (/run), one directory per network
// namespace (the kernel state they describe is per namespace, and is gone
// at boot as they are), one small file per live attachment, replaced
// atomically; the directory's epoch file is made with it.
package ledger

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/portmap-dev/portmap/pkg/netns"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/pkg/workers"
)

// DefaultDir holds one directory per network namespace. Never change it:
// a plugin and an agent of different versions must meet here.
const DefaultDir = "/run/cni-portmap/ledger"

// Verb is what the plugin began for an attachment.
type Verb string

const (
	// Add: the attachment's ADD began (and maybe returned); DEL has not.
	Add Verb = "add"
	// Del: DEL began for an attachment ADDed before the ledger, while the
	// runtime still cached it.
	Del Verb = "del"
)

// Record is what was last begun for one attachment.
type Record struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Verb        Verb   `json:"verb"`
	// NetNS is the container's namespace as the runtime named it
	// (CNI_NETNS); ADD only.
	NetNS string `json:"netns,omitempty"`
	// Plans is plan.Fingerprint of what ADD mapped.
	Plans string `json:"plans,omitempty"`
	// Localhost is what ADD resolved "localhost": "auto" to (nat or
	// socket): a pass plans the attachment so, whatever it would resolve
	// itself. Empty where the configuration did not say "auto", and in
	// records of releases before it.
	Localhost plan.Localhost `json:"localhost,omitempty"`
	Time      time.Time      `json:"time"`
}

// Owner is the record's attachment.
func (r Record) Owner() plan.Owner {
	return plan.Owner{Network: r.Network, ContainerID: r.ContainerID, IfName: r.IfName}
}

// New returns the record of verb v for owner o.
func New(o plan.Owner, v Verb) Record {
	return Record{Network: o.Network, ContainerID: o.ContainerID, IfName: o.IfName, Verb: v, Time: time.Now().UTC()}
}

// ErrNone is a Read that found no ledger at all: no plugin of this
// release wrote one on this node, or the reader's /run is not the
// plugin's (an agent whose /run is a directory of its own). A caller
// that would act on the records' absence (prune what no record holds)
// cannot tell the two apart, and must not.
var ErrNone = errors.New("no ledger")

// Ledger is where the records are kept: Dir on a node, fakehost.Ledger in tests.
type Ledger interface {
	// Write replaces the owner's record. Callers hold the host-wide lock.
	Write(r Record) error
	// Read returns every record, and when the ledger began (zero when
	// no plugin has written one yet); an error wrapping ErrNone (and no
	// records) where no ledger is there at all.
	Read() (map[plan.Owner]Record, time.Time, error)
	// Forget removes the owner's record and reports whether there was
	// one. Callers hold the host-wide lock.
	Forget(o plan.Owner) (bool, error)
}

// Dir is the ledger of the calling thread's network namespace under Root
// (DefaultDir when empty), found on first use.
type Dir struct {
	Root string
	once sync.Once
	dir  string
	err  error
	mu   sync.Mutex
	memo map[string]memo // by file name
	// Parsed counts the files the last Read read and parsed.
	Parsed int
}

var _ Ledger = (*Dir)(nil)

// path is the namespace's directory.
func (d *Dir) path() (string, error) {
	d.once.Do(func() {
		id, err := netns.ID()
		if err != nil {
			d.err = fmt.Errorf("ledger: %w", err)
			return
		}
		d.dir = filepath.Join(cmp.Or(d.Root, DefaultDir), id)
	})
	return d.dir, d.err
}

// fileName is the owner's file: a hash, since network names, container
// IDs and interface names may hold any byte but '/'.
func fileName(o plan.Owner) string {
	h := sha256.Sum256([]byte(o.Network + "\x00" + o.ContainerID + "\x00" + o.IfName))
	return hex.EncodeToString(h[:16])
}

// tmpPrefix starts the name of a record being written; epochFile is
// made with the directory, before any record.
const (
	tmpPrefix = ".tmp-"
	epochFile = ".epoch"
)

// create makes the namespace's directory and its epoch.
func create(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, epochFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// Write replaces the owner's record: a temporary file renamed over it.
func (d *Dir) Write(r Record) error {
	dir, err := d.path()
	if err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if errors.Is(err, os.ErrNotExist) {
		if err = create(dir); err == nil {
			f, err = os.CreateTemp(dir, tmpPrefix+"*")
		}
	}
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, fileName(r.Owner())))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("ledger: record %s of %s/%s/%s: %w", r.Verb, r.Network, r.ContainerID, r.IfName, err)
	}
	return nil
}

// Unread is a ledger file Read could not take as a record of its own: a
// file that does not parse, or whose record is not of its name's owner.
// (A record of a verb this release does not know, a newer release's, is
// read: its owner is known, and its Verb says it is none of Add, Del.)
type Unread struct {
	File string
	Why  string
}

// UnreadError is the error of a Read that found files it could not read
// as records; the records it could read come with it.
type UnreadError struct{ Files []Unread }

func (e *UnreadError) Error() string {
	return fmt.Sprintf("ledger: %s is not a record (%s), and %d more", e.Files[0].File, e.Files[0].Why, len(e.Files)-1)
}

// Known reports whether v is a verb this release writes.
func (v Verb) Known() bool { return v == Add || v == Del }

// Read returns every record. A file that does not parse is left out and
// named by an *UnreadError that comes with the records that did (a
// caller judges what it may do without knowing whose it is); a
// temporary file is skipped. A Dir
// keeps what it read of each file by name, inode, size and modification
// time, and reads again only the files that changed: a pass of the agent
// at 1000 attachments lists the directory and stats each file, and reads
// only the records written since the last pass.
func (d *Dir) Read() (map[plan.Owner]Record, time.Time, error) {
	dir, err := d.path()
	if err != nil {
		return nil, time.Time{}, err
	}
	if _, err := os.Stat(filepath.Dir(dir)); errors.Is(err, os.ErrNotExist) {
		return map[plan.Owner]Record{}, time.Time{}, fmt.Errorf("ledger: %s is not there: %w", filepath.Dir(dir), ErrNone)
	}
	fi, err := os.Stat(filepath.Join(dir, epochFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[plan.Owner]Record{}, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("ledger: %w", err)
	}
	epoch := fi.ModTime()
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("ledger: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// Each file is judged, and read when it changed, by one worker per
	// core: a first read parses every record.
	type one struct {
		m      memo
		ok     bool // a record (not a directory, dot file or vanished file)
		read   bool
		err    error
		unread *Unread
	}
	res := make([]one, len(des))
	workers.Each(len(des), func(i int) {
		de, o := des[i], &res[i]
		name := de.Name()
		if strings.HasPrefix(name, ".") || de.IsDir() {
			return
		}
		info, err := de.Info()
		if errors.Is(err, os.ErrNotExist) {
			return // forgotten meanwhile
		}
		if err != nil {
			o.err = fmt.Errorf("ledger: %w", err)
			return
		}
		st := stampOf(info)
		if m, ok := d.memo[name]; ok && m.stamp == st {
			o.m, o.ok = m, true
			return
		}
		o.read = true
		data, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return
		}
		if err != nil {
			o.err = fmt.Errorf("ledger: %w", err)
			return
		}
		var r Record
		switch err := json.Unmarshal(data, &r); {
		case err != nil:
			o.unread = &Unread{File: filepath.Join(dir, name), Why: err.Error()}
		case r.Verb == "" || fileName(r.Owner()) != name:
			o.unread = &Unread{File: filepath.Join(dir, name), Why: "no record of the owner its name says"}
		default:
			o.m, o.ok = memo{st, r}, true
		}
	})
	memos := make(map[string]memo, len(des))
	out := make(map[plan.Owner]Record, len(des))
	var unread []Unread
	d.Parsed = 0
	for i, o := range res {
		if o.err != nil {
			return nil, time.Time{}, o.err
		}
		if o.unread != nil {
			unread = append(unread, *o.unread)
		}
		if o.read {
			d.Parsed++
		}
		if o.ok {
			memos[des[i].Name()], out[o.m.r.Owner()] = o.m, o.m.r
		}
	}
	d.memo = memos
	if len(unread) > 0 {
		return out, epoch, &UnreadError{Files: unread}
	}
	return out, epoch, nil
}

// memo is a record as read, and the version of its file.
type memo struct {
	stamp stamp
	r     Record
}

// stamp tells one version of a file from another.
type stamp struct {
	ino, size uint64
	mtime     int64
}

func stampOf(fi os.FileInfo) stamp {
	s := stamp{size: uint64(fi.Size()), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// Forget removes the owner's record.
func (d *Dir) Forget(o plan.Owner) (bool, error) {
	dir, err := d.path()
	if err != nil {
		return false, err
	}
	err = os.Remove(filepath.Join(dir, fileName(o)))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	return true, nil
}
