package retryhttp

import (
	"sync"
	"time"
)

// A hedged call arms a timer for its hedge and, answered in time, stops it
// unfired: that is most calls. Making a timer (time.AfterFunc) costs an
// allocation for it and one for its function, and a place in the runtime's
// timer heap under its lock; a stopped timer set again keeps its place.
// So a call done with its hedger and timer unfired hands both on to the
// next call (hedgers): the hedger holds what the hedges would have needed
// and the timer, whose function is the hedger's fire, made once with it.
// What the caller may keep of the first attempt (its request, context and
// body: the answer's Request and Body) is in the call's own hedgeFirst,
// which is never handed on.
//
// This is safe: a hedger is put back only once no hedge was due and
// Stop reported that the timer's function had not started and never will,
// so that nothing but the call itself, about to return, could reach it,
// and the call lets go of it first. A timer made inside a testing/synctest
// bubble is the bubble's (its virtual clock; stopped or set from anywhere
// else, the runtime aborts), and one made outside it runs on real time:
// hedgers are kept and taken only outside any bubble, where the clock has
// a monotonic reading, which a bubble's never has.

// hedgerPool holds a Transport's hedgers whose timers were stopped
// unfired, outside any synctest bubble: the Transport's own, not the
// process's, so that nothing of one Transport outlives it in a global.
type hedgerPool struct{ sync.Pool }

// takeHedger returns a hedger for a call: a kept one when the goroutine
// is in no synctest bubble (noBubble), else a new one.
func (t *Transport) takeHedger(noBubble bool) *hedger {
	if noBubble {
		if h, _ := t.hedgers.Get().(*hedger); h != nil {
			return h
		}
	}
	h := &hedger{keepable: noBubble}
	h.fireFn = h.fire
	return h
}

// arm sets h's timer to fire after d. h.mu is held, so that a fire waits
// until h.timer is set.
func (h *hedger) arm(d time.Duration) {
	if h.timer == nil {
		h.timer = time.AfterFunc(d, h.fireFn)
		return
	}
	h.timer.Reset(d)
}

// disarm stops h's timer, no hedge having been due, and hands h on to the
// next call when the timer's function had not started (and never will)
// and h was made outside any bubble.
func (h *hedger) disarm() {
	if !h.timer.Stop() || !h.keepable {
		return
	}
	pool := &h.t.hedgers
	// What the call held is let go of (its hedgeSet is nil: no hedge was
	// due); the timer and its function stay.
	h.hedgeFirst, h.t, h.lat, h.base, h.req, h.key, h.retryIf = nil, nil, nil, nil, nil, "", nil
	h.firstIn, h.over = false, false
	pool.Put(h)
}

// noBubble reports that the goroutine that read now from the real clock
// is in no synctest bubble: now has a monotonic reading, which a bubble's
// clock never gives. (A wall clock past the year 2157 gives none either:
// such a goroutine is taken to be in one, which only costs it a hedger.)
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
