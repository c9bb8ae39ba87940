// Package workers runs a loop body on every core: a sync pass reads,
// parses and judges a thousand attachments, CPU-bound work that is
// independent per attachment.
package workers

import (
	"runtime"
	"sync"
)

// Each calls f(i) for every i in [0, n) on one goroutine per core and
// returns when all calls have. f must only write to what index i owns.
func Each(n int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				f(i)
			}
		}()
	}
	wg.Wait()
}
