package nettest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Fingerprint is the machine's state a suite must leave as it found it,
// as text: the root network namespace's links, addresses and rules (both
// iptables families, the nftables ruleset), then each of files (its
// content) and dirs (its names; a missing one says so). A dir with a
// pattern ("/run/netns/cni-*") is the names that match it: a suite lists
// only what it could have made where other software makes names too.
func Fingerprint(files, dirs []string) string {
	var b strings.Builder
	for _, args := range [][]string{{"ip", "-o", "link"}, {"ip", "-o", "addr"}, {"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "#") {
				continue // iptables-save's dates
			}
			fmt.Fprintf(&b, "%s: %s\n", args[0], l)
		}
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", args[0], err)
		}
	}
	for _, f := range files {
		v, err := os.ReadFile(f)
		fmt.Fprintf(&b, "file %s = %s %v\n", f, strings.TrimSpace(string(v)), err)
	}
	for _, d := range dirs {
		var names []string
		var err error
		if strings.ContainsAny(d, "*?[") {
			names, err = filepath.Glob(d)
		} else {
			var ents []os.DirEntry
			ents, err = os.ReadDir(d)
			for _, e := range ents {
				names = append(names, e.Name())
			}
		}
		fmt.Fprintf(&b, "dir %s: %s %v\n", d, strings.Join(names, " "), err != nil)
	}
	return b.String()
}

// Changed says how after differs from before, a line each ("+ " added,
// "- " gone); "" when they are equal.
func Changed(before, after string) string {
	if before == after {
		return ""
	}
	in := map[string]int{}
	for _, l := range strings.Split(before, "\n") {
		in[l]++
	}
	var d strings.Builder
	for _, l := range strings.Split(after, "\n") {
		if in[l] > 0 {
			in[l]--
			continue
		}
		fmt.Fprintf(&d, "+ %s\n", l)
	}
	for l, n := range in {
		for ; n > 0; n-- {
			fmt.Fprintf(&d, "- %s\n", l)
		}
	}
	if d.Len() == 0 { // the same lines in another order
		return "before:\n" + before + "after:\n" + after
	}
	return d.String()
}
