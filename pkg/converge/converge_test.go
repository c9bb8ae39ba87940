package converge

import (
	"errors"
	"fmt"
	"testing"
)

func TestJudgeKeepsOrder(t *testing.T) {
	for _, n := range []int{0, 1, 7, 1000} {
		got := Judge(n, func(i int) string { return fmt.Sprint(i) })
		if len(got) != n {
			t.Fatalf("n=%d: %d results", n, len(got))
		}
		for i, s := range got {
			if s != fmt.Sprint(i) {
				t.Fatalf("n=%d: result %d is %q", n, i, s)
			}
		}
	}
}

func TestWriteOutcome(t *testing.T) {
	r := NewReport(2)
	r.Results[1] = Result{State: Repaired, What: "chain missing"}
	r.Orphans = []Orphan{{Network: "n", ContainerID: "c"}}
	r.WriteFailed(map[int]bool{1: true}, false, errors.New("kernel says no"))
	if r.Results[0].State != OK || r.Results[1] != (Result{Error, "chain missing: kernel says no"}) || r.Orphans[0].Err != "" {
		t.Errorf("after a failed write without prune: %+v", r)
	}
	r.WriteFailed(nil, true, errors.New("kernel says no"))
	if r.Orphans[0].Err != "kernel says no" {
		t.Errorf("a failed prune leaves the orphan without its error: %+v", r.Orphans)
	}
	r = NewReport(0)
	r.Orphans = []Orphan{{}}
	r.WriteDone(true)
	if !r.Wrote || !r.Orphans[0].Pruned {
		t.Errorf("after a pruning write: %+v", r)
	}
}
