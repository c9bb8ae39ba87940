package converge

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// state is what the test pass reads: what each wanted plan lacks, the
// shared objects missing, the objects no plan owns.
type state struct {
	whys   []string
	shared []string
	owners [][2]string // network, container ID
	tidy   bool
}

// The one shape of a sync pass: what Run reports, which orphans the
// rule lets through, when it writes and what the write is asked.
func TestRun(t *testing.T) {
	kernelSaysNo := errors.New("kernel says no")
	for _, tt := range []struct {
		name     string
		st       state
		readErr  error
		o        Options
		wrote    bool
		writeErr error
		// what Write was asked ("" : not called) and what the report says
		asked   string
		results string
		orphans string
		held    string
		pass    bool // the report's Wrote
		err     bool
	}{
		{name: "all right: no write", st: state{whys: []string{"", ""}}, results: "ok,ok"},
		{name: "a broken plan", st: state{whys: []string{"", "chain missing"}}, wrote: true,
			asked: "shared=false broken=[1] prune=[]", results: "ok,repaired chain missing", pass: true},
		{name: "shared only", st: state{whys: []string{""}, shared: []string{"map missing"}}, wrote: true,
			asked: "shared=true broken=[] prune=[]", results: "ok", pass: true},
		{name: "dry run writes nothing", st: state{whys: []string{"x"}, owners: [][2]string{{"n", "c"}}}, o: Options{DryRun: true, Prune: true},
			results: "repaired x", orphans: "n/c"},
		{name: "orphans without prune: reported, not written", st: state{owners: [][2]string{{"n", "c"}}}, orphans: "n/c"},
		{name: "orphans pruned", st: state{owners: [][2]string{{"n", "c"}, {"", "d"}}}, o: Options{Prune: true}, wrote: true,
			asked: "shared=false broken=[] prune=[n/c /d]", orphans: "n/c pruned,?/d pruned", pass: true},
		{name: "the orphan rule: out of scope, kept by each clock", st: state{owners: [][2]string{{"other", "a"}, {"n", "fresh"}, {"n", "once"}, {"n", "held"}, {"n", "c"}, {"m", "x"}, {"", ""}}},
			o: Options{Prune: true, InScope: func(n string) bool { return n != "other" },
				Keep: func(network, id string) Keep {
					if network == "m" {
						return Keep{NoEvidence, "no entry of network m"}
					}
					return map[string]Keep{"fresh": {ByCache, "cached during the pass"}, "once": {ByLastPass, "seen once"},
						"held": {ByLedger, "ADD in flight"}, "": {NoEvidence, "names no owner"}}[id]
				}},
			wrote: true, asked: "shared=false broken=[] prune=[n/c]", orphans: "n/c pruned",
			held: "n/held ADD in flight,m/x no entry of network m,?/? names no owner", pass: true},
		{name: "bookkeeping alone is written", st: state{tidy: true}, wrote: true, asked: "shared=false broken=[] prune=[]", pass: true},
		{name: "a write that changed nothing", st: state{whys: []string{"x"}}, asked: "shared=false broken=[0] prune=[]", results: "repaired x"},
		{name: "a failed write", st: state{whys: []string{"x", ""}, owners: [][2]string{{"n", "c"}}}, o: Options{Prune: true}, writeErr: kernelSaysNo,
			asked: "shared=false broken=[0] prune=[n/c]", results: "error x: kernel says no,ok", orphans: "n/c kernel says no"},
		{name: "a failed write after a partial one", st: state{whys: []string{"x"}}, wrote: true, writeErr: kernelSaysNo,
			asked: "shared=false broken=[0] prune=[]", results: "error x: kernel says no", pass: true},
		{name: "a failed read fails the pass", readErr: kernelSaysNo, err: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			asked := ""
			rep, err := Run(len(tt.st.whys), tt.o, Pass[state, string]{
				Read: func() (state, error) { return tt.st, tt.readErr },
				Decide: func(s state) Verdict[string] {
					v := Verdict[string]{Shared: s.shared, Whys: s.whys, Tidy: s.tidy}
					for _, o := range s.owners {
						v.Candidates = append(v.Candidates, Candidate[string]{Network: o[0], ContainerID: o[1], Object: "chain", Handle: o[0] + "/" + o[1]})
					}
					return v
				},
				Write: func(_ state, fix Repair[string]) (bool, error) {
					var broken []string
					for i := range len(tt.st.whys) {
						if fix.Broken[i] {
							broken = append(broken, string(rune('0'+i)))
						}
					}
					asked = "shared=" + map[bool]string{true: "true", false: "false"}[fix.Shared] +
						" broken=[" + strings.Join(broken, " ") + "] prune=[" + strings.Join(fix.Prune, " ") + "]"
					return tt.wrote, tt.writeErr
				},
			})
			if (err != nil) != tt.err || (err == nil) != (rep != nil) {
				t.Fatalf("Run: %v, %v", rep, err)
			}
			if err != nil {
				return
			}
			var results, orphans, held []string
			for _, r := range rep.Results {
				results = append(results, strings.TrimSpace(string(r.State)+" "+r.What))
			}
			for _, o := range rep.Orphans {
				s := o.Network + "/" + o.ContainerID
				if o.Pruned {
					s += " pruned"
				}
				if o.Err != "" {
					s += " " + o.Err
				}
				orphans = append(orphans, s)
			}
			for _, o := range rep.Kept {
				held = append(held, o.Network+"/"+o.ContainerID+" "+o.Err)
			}
			got := []string{asked, strings.Join(results, ","), strings.Join(orphans, ","), strings.Join(held, ",")}
			want := []string{tt.asked, tt.results, tt.orphans, tt.held}
			if !reflect.DeepEqual(got, want) || rep.Wrote != tt.pass || !reflect.DeepEqual(rep.Shared, tt.st.shared) {
				t.Errorf("write asked, results, orphans, held:\n got %q wrote %v shared %q\nwant %q wrote %v", got, rep.Wrote, rep.Shared, want, tt.pass)
			}
		})
	}
}
