package retryhttp

import (
	"sync"
	"time"
)

// A hedged call arms a timer for its hedge, and most calls are answered
// before it would fire. Making a timer (time.AfterFunc) costs an
// allocation for it and one for its function; setting or stopping one
// takes the runtime's timer lock, and with it about a third of what a
// call answered in time paid for hedging. So a call done with its hedger,
// no hedge having gone, hands it on to the next call (hedgers) with its
// timer still set: the hedger holds what the hedges would have needed and
// the timer, whose function is the hedger's fire, made once with it. The
// next call sets the timer only when it would fire after the call's own
// moment (due); a timer that fires before a call's moment finds it not yet
// come and is set for it then, and one that fires while no call holds the
// hedger does nothing. With a fixed delay, a stream of calls answered in
// time sets the timer once per delay, not twice per call. What the caller
// may keep of the first attempt (its request, context and body: the
// answer's Request and Body) is in the call's own hedgeFirst, which is
// never handed on.
//
// This is safe: fire reads nothing of a call but under h.mu, and only
// once it found a call holding the hedger (due set) whose moment has
// come; a call lets go of the hedger under h.mu, due cleared, before the
// hedger goes back. A hedger dropped from the pool keeps its timer until
// it fires once, finding no call: it holds no Transport then. A timer made
// inside a testing/synctest bubble is the bubble's (its virtual clock;
// stopped or set from anywhere else, the runtime aborts), and one made
// outside it runs on real time: hedgers are kept and taken only outside
// any bubble, where the clock has a monotonic reading, which a bubble's
// never has; a bubble's hedger stops its timer when its call is done.

// hedgerPool holds a Transport's hedgers that no hedge was sent from,
// outside any synctest bubble: the Transport's own, not the process's,
// so that nothing of one Transport outlives it in a global.
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

// arm makes h's first hedge due d after now, a reading of the clock the
// timer runs on, and sets the timer unless it is set to fire sooner
// already (fire then sets it again for due). h.mu is held.
func (h *hedger) arm(now time.Time, d time.Duration) {
	h.due = now.Add(d)
	switch {
	case h.timer == nil:
		h.timer = time.AfterFunc(d, h.fireFn)
	case h.set.IsZero() || h.set.After(h.due):
		h.timer.Reset(d)
	default:
		return
	}
	h.set = h.due
}

// early reports, when h's timer fired, whether it fired before the first
// hedge of the call holding h was due, and sets it again for that moment
// if so; with no call holding h (due zero) there is nothing to fire. It
// is the first thing fire does, and forgets the moment the timer was set
// for. h.mu is held.
func (h *hedger) early() bool {
	h.set = time.Time{}
	if h.due.IsZero() {
		return true
	}
	if h.hedgeSet != nil {
		return false // a hedge's timer: due is the first's
	}
	if wait := time.Until(h.due); wait > 0 {
		h.timer.Reset(wait)
		h.set = h.due
		return true
	}
	return false
}

// disarm ends the call's hold on h, no hedge having been due, and hands h
// on to the next call when h was made outside any bubble, its timer still
// set; a bubble's hedger stops its timer.
func (h *hedger) disarm() {
	h.mu.Lock()
	if !h.keepable {
		h.due = time.Time{}
		h.mu.Unlock()
		h.timer.Stop()
		return
	}
	pool := &h.t.hedgers
	// What the call held is let go of (its hedgeSet is nil: no hedge was
	// due); the timer and its function stay.
	h.hedgeFirst, h.t, h.lat, h.base, h.req, h.key, h.retryIf = nil, nil, nil, nil, nil, "", nil
	h.firstIn, h.over, h.due = false, false, time.Time{}
	h.mu.Unlock()
	pool.Put(h)
}

// noBubble reports that the goroutine that read now from the real clock
// is in no synctest bubble: now has a monotonic reading, which a bubble's
// clock never gives. (A wall clock past the year 2157 gives none either:
// such a goroutine is taken to be in one, which only costs it a hedger.)
func noBubble(now time.Time) bool {
	return now != now.Round(0)
}

// timerNow is a reading of the clock that the hedge's timer runs on (the
// runtime's, or a bubble's): when the call's attempt was let go, when the
// Transport read it from the real clock, else a reading of its own.
func (c *call) timerNow() time.Time {
	if c.t.mono && !c.adm.at.IsZero() {
		return c.adm.at
	}
	return time.Now()
}
