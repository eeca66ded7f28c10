package retryhttp

import "time"

// A Transport is calm while its in-process limiter holds no entry for any
// host: none is parked, paced or modelled, so every attempt is admitted at
// once. A calm call's first try then reads no clock: a reading costs as
// much as the rest of the success path. Its first try is counted undated
// (lazyCounter), and it has no send time: should its answer need one
// (observe), calmSent bounds it.

// calm reports, with one atomic load, that the Transport holds nothing for
// any host, so that an attempt made now is admitted without a clock
// reading. A configured pace, another Limiter or an attempt timeout, all
// of which time the attempt, make no call calm. A hedge delay needs a
// reading for its timer, which the hedged call makes itself (timerNow), and
// a learned one times the first attempt from it too: on the real clock it
// is the reading the Transport would have made; on another Clock the
// attempt is timed on that clock, and a learned hedge delay makes no call
// calm.
func (t *Transport) calm(c *call) bool {
	return t.free != nil && t.free.entries.Load() == 0 && (t.latencies == nil || t.mono) && c.attemptTimeout == 0
}

// unheld reports that the call's host holds no entry while others do, so
// that its first try, too, is admitted without a clock reading: the host
// is neither parked nor paced nor modelled, whatever other hosts are (the
// limiter's filter says so with one atomic load, and admit would let it go
// at once). The call is counted undated, as a calm one; the clock readings
// that dating its batch makes run the time sweep (sweep.go), which the
// readings of the success path ran before: every undatedBatch unheld calls
// two of them, enough for a sweep that runs every sweepStep. A Transport
// that counts nothing (no budget, learning off) has no such readings: its
// calls read the clock.
func (t *Transport) unheld(c *call) bool {
	if t.free == nil || (t.latencies != nil && !t.mono) || c.attemptTimeout != 0 || (t.budget == nil && t.noLearning) {
		return false
	}
	c.hash = c.hostHash()
	return !t.free.mayHold(c.hash)
}

// countUndated counts a first try of a calm or unheld call undated, on the
// budget when there is one, and, for an unheld call, runs the time sweep
// on any clock reading the count made.
func (c *call) countUndated(counter *lazyCounter) {
	if at, read := counter.addUndated(c.t.clock); read && c.unheld {
		c.t.free.tick(at)
	}
}

// calmSent is, read at now, the latest moment an attempt sent while the
// Transport was calm can have been sent: now, while it is calm still, else
// just before the first entry since was made (no entry was there when it
// went). It stands for the send time in what the answer tells, which it
// brings no later than the first record it can be an answer to.
func (t *Transport) calmSent(now time.Time) time.Time {
	l := t.free
	if l == nil || l.entries.Load() == 0 {
		return now
	}
	if at := l.epoch.Add(time.Duration(l.heldSince.Load()) - 1); at.Before(now) {
		return at
	}
	return now
}

// answeredAt reads the clock for the answer of an attempt sent at sent: on
// the real clock, from the monotonic clock alone (time.Since, about half
// the cost of a time.Now), as sent plus the time since; the wall reading
// is sent's, moved on by as much. Inside a synctest bubble, and on any
// other Clock, it is the clock's reading. It returns the latency too,
// now.Sub(sent), which the time since is: no second subtraction.
func (t *Transport) answeredAt(sent time.Time) (now time.Time, latency time.Duration) {
	if t.mono && !sent.IsZero() {
		latency = time.Since(sent)
		return sent.Add(latency), latency
	}
	now = t.clock.Now()
	if !sent.IsZero() {
		latency = now.Sub(sent) // else the caller's, once it has dated the attempt
	}
	return now, latency
}
