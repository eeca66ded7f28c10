package retryhttp

import (
	"sync"
	"sync/atomic"
	"time"
)

// A hedged call arms a timer for its hedge and, answered in time, stops it
// unfired: that is most calls. Making a timer (time.AfterFunc) costs an
// allocation for it and one for its function, and a place in the runtime's
// timer heap under its lock; a stopped timer set again keeps its place.
// So the timer, and the function it runs, are kept for the next call once
// a call is done with them unfired.
//
// This is safe: a timer is put back only once Stop reported that its
// function had not started and never will, so nothing of the call's
// (its hedger) is reached through it once put back, and a call's hedger
// is reached through the timer's holder alone, which the next call sets
// before it sets the timer. A timer made inside a testing/synctest bubble
// is the bubble's (its virtual clock; stopped or set from anywhere else,
// the runtime aborts), and one made outside it runs on real time: timers
// are kept and taken only outside any bubble, where the clock has a
// monotonic reading, which a bubble's never has.

// hedgeTimer is a hedge's timer and the hedger it fires for.
type hedgeTimer struct {
	timer *time.Timer
	h     atomic.Pointer[hedger]
}

// hedgeTimers are timers stopped unfired, outside any synctest bubble.
var hedgeTimers sync.Pool

// fire is the timer's function: the hedge of the hedger it is set for.
func (ht *hedgeTimer) fire() {
	if h := ht.h.Load(); h != nil {
		h.fire()
	}
}

// arm sets h's timer to fire after d: a kept one when the goroutine is in
// no synctest bubble (noBubble), else a new one. h.mu is held, so that a
// fire waits until h.tm is set.
func (h *hedger) arm(d time.Duration, noBubble bool) {
	h.keepTimer = noBubble
	if noBubble {
		if ht, _ := hedgeTimers.Get().(*hedgeTimer); ht != nil {
			ht.h.Store(h)
			h.tm = ht
			ht.timer.Reset(d)
			return
		}
	}
	ht := new(hedgeTimer)
	ht.h.Store(h)
	h.tm = ht
	ht.timer = time.AfterFunc(d, ht.fire)
}

// disarm stops h's timer, no hedge having been due: kept for the next
// call when its function had not started (and never will) and it was
// made outside any bubble.
func (h *hedger) disarm() {
	ht := h.tm
	if ht.timer.Stop() && h.keepTimer {
		h.tm = nil
		ht.h.Store(nil)
		hedgeTimers.Put(ht)
	}
}

// noBubble reports that the goroutine that read now from the real clock
// is in no synctest bubble: now has a monotonic reading, which a bubble's
// clock never gives. (A wall clock past the year 2157 gives none either:
// such a goroutine is taken to be in one, which only costs it a timer.)
func noBubble(now time.Time) bool {
	return now != now.Round(0)
}

// noBubble is noBubble for the call's goroutine, from its start when it
// read the real clock, else from a reading of its own.
func (c *call) noBubble() bool {
	if c.t.mono && !c.start.IsZero() {
		return noBubble(c.start)
	}
	return noBubble(time.Now())
}
