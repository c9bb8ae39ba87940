// Package deadline is the one deadline of a CNI verb or an agent pass.
// Each wait outside the process has a bound of its own (the host lock
// 30 s, a tool 30 s, a netlink answer 10 s); a verb may wait several
// times, so each waits at most what is left of the verb's deadline too,
// and the sum of its waits is bounded: the verb goes on or fails naming
// what did not answer, never past it.
package deadline

import (
	"sync/atomic"
	"time"
)

// Verb is a CNI verb's deadline: 60 s, half of kubelet's default
// --runtime-request-timeout (2 min), within which the runtime sets up a
// pod's sandbox with every plugin of its chain. One full wait for the
// host lock (30 s) and one for a tool (30 s) fit in it.
const Verb = 60 * time.Second

// Pass is an agent pass's deadline, for the same waits; the agent's
// watchdog (90 s) allows a pass that used all of it.
const Pass = 60 * time.Second

// end is when the deadline passes (Unix nanoseconds); 0: none set.
var end atomic.Int64

// Set starts a deadline of d from now for what the process does next,
// and returns what clears it.
func Set(d time.Duration) (clear func()) {
	at := time.Now().Add(d).UnixNano()
	end.Store(at)
	return func() { end.CompareAndSwap(at, 0) }
}

// Within is bound, or what is left of the deadline where that is less (0
// once it has passed).
func Within(bound time.Duration) time.Duration {
	at := end.Load()
	if at == 0 {
		return bound
	}
	return max(0, min(bound, time.Until(time.Unix(0, at))))
}
