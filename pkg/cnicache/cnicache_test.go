package cnicache

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const conflist = `{"cniVersion":"1.0.0","name":"net1","plugins":[
 {"type":"ptp","ipam":{"type":"host-local"}},
 {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false},"snat":false}]}`

var result = map[string]any{"cniVersion": "1.0.0", "ips": []any{map[string]any{"address": "192.0.2.2/24"}}}

func TestPluginConfigAsLibcniBuildsIt(t *testing.T) {
	caps := map[string]json.RawMessage{
		"portMappings": json.RawMessage(`[{"hostPort":8080,"containerPort":80}]`),
		"bandwidth":    json.RawMessage(`{"ingressRate":1}`),
		"ips":          json.RawMessage(`["192.0.2.9"]`),
	}
	rawResult, _ := json.Marshal(result)
	stdin, err := pluginConfigOf([]byte(conflist), "portmap", caps, rawResult)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(stdin, &got); err != nil {
		t.Fatal(err)
	}
	if got["name"] != "net1" || got["cniVersion"] != "1.0.0" || got["type"] != "portmap" || got["snat"] != false {
		t.Errorf("plugin keys: %v", got)
	}
	rc, _ := got["runtimeConfig"].(map[string]any)
	if len(rc) != 1 || rc["portMappings"] == nil {
		t.Errorf("runtimeConfig %v: want only the declared, enabled capability", rc)
	}
	if pr, _ := got["prevResult"].(map[string]any); pr["cniVersion"] != "1.0.0" {
		t.Errorf("prevResult %v", got["prevResult"])
	}

	// A plugin without the capability gets no runtimeConfig.
	stdin, _ = pluginConfigOf([]byte(strings.Replace(conflist, `"portMappings":true`, `"portMappings":false`, 1)), "portmap", caps, rawResult)
	if strings.Contains(string(stdin), "runtimeConfig") {
		t.Errorf("undeclared capability passed: %s", stdin)
	}
	// A single-plugin configuration, as AddNetwork caches it.
	stdin, err = pluginConfigOf([]byte(`{"cniVersion":"0.4.0","name":"one","type":"portmap","capabilities":{"portMappings":true}}`), "portmap", caps, nil)
	if err != nil || !strings.Contains(string(stdin), `"name":"one"`) || strings.Contains(string(stdin), "prevResult") {
		t.Errorf("single config: %s, %v", stdin, err)
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(id string, age time.Duration, conf string) {
		t.Helper()
		if err := Write(dir, Entry{Network: "net1", ContainerID: id, IfName: "eth0", Conflist: []byte(conf), Result: result}); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "results", "net1-"+id+"-eth0")
		ts := time.Now().Add(-age)
		if err := os.Chtimes(f, ts, ts); err != nil {
			t.Fatal(err)
		}
	}
	write("new", time.Minute, conflist)
	write("old", time.Hour, conflist)
	write("plain", time.Hour, `{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"ptp"}]}`)
	results := filepath.Join(dir, "results")
	for name, content := range map[string]string{
		"net1-trunc-eth0": `{"kind":"cniCacheV1","containerId":`,
		"net1-kind-eth0":  `{"kind":"cniCacheV2","containerId":"x","ifName":"eth0","networkName":"net1"}`,
		"net1-noid-eth0":  `{"kind":"cniCacheV1","ifName":"eth0","networkName":"net1"}`,
	} {
		if err := os.WriteFile(filepath.Join(results, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	atts, skipped, err := Read(dir, "portmap")
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 2 || atts[0].ContainerID != "old" || atts[1].ContainerID != "new" {
		t.Errorf("attachments %+v: want old, then new", atts)
	}
	why := map[string]Skipped{}
	for _, s := range skipped {
		why[filepath.Base(s.File)] = s
	}
	for name, corrupt := range map[string]bool{"net1-trunc-eth0": true, "net1-kind-eth0": true, "net1-noid-eth0": true, "net1-plain-eth0": false} {
		s, ok := why[name]
		if !ok || s.Corrupt != corrupt || s.Why == "" {
			t.Errorf("%s: skipped %v %+v, want corrupt=%v with a reason", name, ok, s, corrupt)
		}
	}
	// a cache directory that is not there is no evidence of an empty
	// cache; one whose results libcni has not made yet is empty
	if atts, _, err := Read(filepath.Join(dir, "missing"), "portmap"); !errors.Is(err, ErrNoCache) || atts != nil || !strings.Contains(err.Error(), filepath.Join(dir, "missing")) {
		t.Errorf("a missing cache directory: %v %v, want ErrNoCache naming it", atts, err)
	}
	if _, _, err := Read(filepath.Join(results, "net1-new-eth0"), "portmap"); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file for a cache directory: %v", err)
	}
	if atts, skipped, err := Read(t.TempDir(), "portmap"); err != nil || atts != nil || skipped != nil {
		t.Errorf("a cache without results: %v %v %v, want empty", atts, skipped, err)
	}
	// results that cannot be read: an error, not an empty cache
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "results"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if atts, _, err := Read(broken, "portmap"); err == nil || atts != nil {
		t.Errorf("unreadable results: %v %v, want an error", atts, err)
	}
}

// TestReaderKeepsUnchangedFiles: a Reader parses a file again only when
// it changed (new modification time, or replaced by another inode), and
// forgets removed files.
func TestReaderKeepsUnchangedFiles(t *testing.T) {
	dir := t.TempDir()
	file := func(id string) string { return filepath.Join(dir, "results", "net1-"+id+"-eth0") }
	write := func(id, conf string) {
		t.Helper()
		if err := Write(dir, Entry{Network: "net1", ContainerID: id, IfName: "eth0", Conflist: []byte(conf), Result: result}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		write(id, conflist)
	}
	r := &Reader{PluginType: "portmap"}
	read := func(wantParsed, wantAtts int) []Attachment {
		t.Helper()
		atts, _, err := r.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		if r.Parsed != wantParsed || len(atts) != wantAtts {
			t.Fatalf("parsed %d files and found %d attachments, want %d and %d", r.Parsed, len(atts), wantParsed, wantAtts)
		}
		return atts
	}
	first := read(3, 3)
	again := read(0, 3)
	for i := range first {
		if first[i].File != again[i].File || string(first[i].Stdin) != string(again[i].Stdin) {
			t.Errorf("a kept entry differs: %+v, then %+v", first[i], again[i])
		}
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(file("a"), later, later); err != nil {
		t.Fatal(err)
	}
	read(1, 3)
	// Replaced by a rename, as atomic writers do (another inode), with
	// the modification time it had.
	fi, err := os.Stat(file("b"))
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := Write(other, Entry{Network: "net1", ContainerID: "b", IfName: "eth0", Result: result,
		Conflist: []byte(strings.Replace(conflist, `"portmap"`, `"portmap", "snat": false`, 1))}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(other, "results", "net1-b-eth0"), file("b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(file("b"), fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	atts := read(1, 3)
	var b Attachment
	for _, a := range atts {
		if a.ContainerID == "b" {
			b = a
		}
	}
	if !strings.Contains(string(b.Stdin), `"snat":false`) {
		t.Errorf("the replaced entry reads as before: %s", b.Stdin)
	}
	if err := os.Remove(file("c")); err != nil {
		t.Fatal(err)
	}
	read(0, 2)
	if _, ok := r.memo[file("c")]; ok {
		t.Error("a removed file is still kept")
	}
}

func TestMapped(t *testing.T) {
	dir := t.TempDir()
	conf := `{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"ptp"},{"type":"portmap","capabilities":{"portMappings":true}}]}`
	pm := map[string]any{"portMappings": []any{map[string]any{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}}}
	res := func(addrs ...string) map[string]any {
		var ips []any
		for _, a := range addrs {
			ips = append(ips, map[string]any{"address": a})
		}
		return map[string]any{"cniVersion": "1.0.0", "ips": ips}
	}
	for _, e := range []Entry{
		{Network: "net1", ContainerID: "nomap", IfName: "eth0", Conflist: []byte(conf), Result: res("10.0.0.2/24", "fd00::2/64")},
		{Network: "net1", ContainerID: "v6", IfName: "eth0", Conflist: []byte(conf), CapabilityArgs: pm, Result: res("fd00::3/64")},
		// another network whose name starts with this one's
		{Network: "net1-b", ContainerID: "v4", IfName: "eth0", Conflist: []byte(conf), CapabilityArgs: pm, Result: res("10.0.0.4/24")},
	} {
		if err := Write(dir, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "results", "net1-corrupt-eth0"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir, network string
		fams         map[int]bool
		want         string
	}{
		{dir, "net1", map[int]bool{4: true}, ""},
		{dir, "net1", map[int]bool{6: true}, "net1-v6-eth0"},
		{dir, "net1", map[int]bool{4: true, 6: true}, "net1-v6-eth0"},
		{dir, "net1-b", map[int]bool{4: true}, "net1-b-v4-eth0"},
		{dir, "net2", map[int]bool{4: true, 6: true}, ""},
		{filepath.Join(dir, "none"), "net1", map[int]bool{6: true}, ""},
	} {
		got, err := Mapped(c.dir, c.network, c.fams)
		if err != nil || filepath.Base(got) != c.want && !(got == "" && c.want == "") {
			t.Errorf("Mapped(%s, %v) = %q, %v; want %q", c.network, c.fams, got, err, c.want)
		}
	}
}

// pluginConfigOf is what Read gives as an attachment's Stdin for
// conflist, capArgs and result.
func pluginConfigOf(conflist []byte, pluginType string, capArgs map[string]json.RawMessage, result json.RawMessage) ([]byte, error) {
	return (&listCache{m: map[string]*parsedList{}}).pluginConfig(conflist, pluginType, capArgs, result)
}
