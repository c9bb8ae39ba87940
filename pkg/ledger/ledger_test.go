package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/pkg/plan"
)

var (
	o1 = plan.Owner{Network: "net1", ContainerID: "c1", IfName: "eth0"}
	// o2's fields run into each other if joined without a separator.
	o2 = plan.Owner{Network: "net1-c", ContainerID: "1", IfName: "eth0"}
)

func TestDirWriteReadForget(t *testing.T) {
	root := t.TempDir()
	d := &Dir{Root: root}
	recs, epoch, err := d.Read()
	if err != nil || len(recs) != 0 || !epoch.IsZero() {
		t.Fatalf("a ledger nobody wrote: %v %v %v, want empty, no epoch", recs, epoch, err)
	}
	before := time.Now().Add(-time.Second)
	r1 := New(o1, Add)
	r1.NetNS, r1.Plans = "/run/netns/c1", "abc"
	if err := d.Write(r1); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(New(o2, Del)); err != nil {
		t.Fatal(err)
	}
	recs, epoch, err = d.Read()
	if err != nil {
		t.Fatal(err)
	}
	if epoch.Before(before) || epoch.After(time.Now()) {
		t.Errorf("epoch %v, want the first write's time", epoch)
	}
	if got := recs[o1]; got.Verb != Add || got.NetNS != "/run/netns/c1" || got.Plans != "abc" {
		t.Errorf("record of o1: %+v", got)
	}
	if got := recs[o2]; got.Verb != Del || len(recs) != 2 {
		t.Errorf("records %+v, want o1's and o2's apart", recs)
	}
	// One directory per network namespace, named by the kernel's id.
	dirs, _ := os.ReadDir(root)
	if len(dirs) != 1 || !strings.HasPrefix(dirs[0].Name(), "cookie-") && !strings.HasPrefix(dirs[0].Name(), "inode-") {
		t.Errorf("under the root: %v, want one namespace directory", dirs)
	}
	// A rewrite replaces the record; the epoch stays.
	r1.Plans = "def"
	if err := d.Write(r1); err != nil {
		t.Fatal(err)
	}
	recs, epoch2, _ := d.Read()
	if recs[o1].Plans != "def" || !epoch2.Equal(epoch) {
		t.Errorf("after a rewrite: %+v, epoch %v (was %v)", recs[o1], epoch2, epoch)
	}
	// The next read parses only what changed.
	if _, _, err := d.Read(); err != nil || d.Parsed != 0 {
		t.Errorf("a read with nothing changed parsed %d files (%v)", d.Parsed, err)
	}
	r1.Plans = "ghi"
	if err := d.Write(r1); err != nil {
		t.Fatal(err)
	}
	if recs, _, err := d.Read(); err != nil || d.Parsed != 1 || recs[o1].Plans != "ghi" {
		t.Errorf("a read after one rewrite parsed %d files, o1 %+v (%v)", d.Parsed, recs[o1], err)
	}
	if had, err := d.Forget(o1); !had || err != nil {
		t.Errorf("Forget o1: %t %v, want it had one", had, err)
	}
	if had, err := d.Forget(o1); had || err != nil {
		t.Errorf("Forget o1 again: %t %v, want none and no error", had, err)
	}
	if recs, _, _ := d.Read(); len(recs) != 1 {
		t.Errorf("after Forget: %+v", recs)
	}
}

// A file that is not a record is named by an *UnreadError that comes
// with the records read beside it; a record of a verb this release does
// not know (a newer release's) is read, owner and verb as written.
func TestDirReadNamesWhatIsNotARecord(t *testing.T) {
	d := &Dir{Root: t.TempDir()}
	if err := d.Write(New(o1, Add)); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(New(o2, Add)); err != nil {
		t.Fatal(err)
	}
	dir, _ := d.path()
	// A write cut short leaves a temporary file: not read.
	if err := os.WriteFile(filepath.Join(dir, tmpPrefix+"123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if recs, _, err := d.Read(); err != nil || len(recs) != 2 {
		t.Fatalf("with a temporary file: %v %v", recs, err)
	}
	for name, content := range map[string]string{
		"garbage":    "not json",
		"wrong name": `{"network":"net1","containerID":"c3","ifName":"eth0","verb":"add"}`,
		"no verb":    `{"network":"net1","containerID":"c1","ifName":"eth0"}`,
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, fileName(o1))
			if name == "wrong name" {
				file = filepath.Join(dir, "0123456789abcdef0123456789abcdef")
				defer os.Remove(file)
			} else {
				defer d.Write(New(o1, Add))
			}
			if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			recs, _, err := d.Read()
			var ue *UnreadError
			if !errors.As(err, &ue) || len(ue.Files) != 1 || ue.Files[0].File != file || !strings.Contains(err.Error(), "is not a record") {
				t.Fatalf("read: %v, want the file named as not a record", err)
			}
			if _, ok := recs[o2]; !ok {
				t.Errorf("the record beside it was not read: %v", recs)
			}
		})
	}
	if err := os.WriteFile(filepath.Join(dir, fileName(o1)), []byte(`{"network":"net1","containerID":"c1","ifName":"eth0","verb":"pause"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, _, err := d.Read()
	if err != nil || recs[o1].Verb != "pause" || recs[o1].Verb.Known() || !recs[o2].Verb.Known() {
		t.Errorf("a newer release's verb: %v %v, want the record read as written", recs, err)
	}
}

// What the ledger adds to an ADD and a DEL (a record written, then
// forgotten) and to a pass (the directory read) on this machine's /run:
// go test -bench . ./pkg/ledger (figures in docs/node.md).
func BenchmarkAddDel(b *testing.B) {
	d := &Dir{Root: benchRoot(b)}
	r := New(o1, Add)
	r.NetNS, r.Plans = "/run/netns/c1", "0123456789abcdef0123456789abcdef"
	for b.Loop() {
		if err := d.Write(r); err != nil {
			b.Fatal(err)
		}
		if _, err := d.Forget(o1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead1000(b *testing.B) {
	d := &Dir{Root: benchRoot(b)}
	write1000(b, d)
	for b.Loop() {
		if recs, _, err := d.Read(); err != nil || len(recs) != 1000 {
			b.Fatal(len(recs), err)
		}
	}
}

// benchRoot is a directory in a tmpfs, where the ledger lives on a node.
func benchRoot(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "ledger-bench-")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A first read (a one-shot `portmap-agent sync`): every record parsed.
func BenchmarkFirstRead1000(b *testing.B) {
	root := benchRoot(b)
	write1000(b, &Dir{Root: root})
	for b.Loop() {
		fresh := &Dir{Root: root}
		if recs, _, err := fresh.Read(); err != nil || len(recs) != 1000 {
			b.Fatal(len(recs), err)
		}
	}
}

// write1000 records 1000 attachments.
func write1000(b *testing.B, d *Dir) {
	for i := range 1000 {
		r := New(plan.Owner{Network: "net1", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}, Add)
		r.NetNS, r.Plans = "/run/netns/c", "0123456789abcdef0123456789abcdef"
		if err := d.Write(r); err != nil {
			b.Fatal(err)
		}
	}
}
