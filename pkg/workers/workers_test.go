package workers

import "testing"

func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 3, 1000} {
		seen := make([]int, n)
		Each(n, func(i int) { seen[i]++ })
		for i, c := range seen {
			if c != 1 {
				t.Fatalf("n=%d: index %d called %d times", n, i, c)
			}
		}
	}
}
