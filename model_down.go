package retryhttp

import (
	"math"
)

// outage is what a down host's record keeps.
type outage struct {
	next       instant // the next probe
	turnedAway sliding // what the callers asked while it was down
	oldRate    float64 // what it accepted before its run of failures
	oldCtl     holding // how it was held before the run
}

// admitDown lets a probe go once every probeEvery, and hands every other
// attempt back at once.
func (m *hostModel) admitDown(host string, now instant) Reservation {
	d := m.down
	if !now.Before(d.next) {
		d.next = now.Add(probeEvery)
		return Reservation{OK: true, Report: true, Ticket: m.send(now)}
	}
	d.turnedAway.add(now)
	return Reservation{Down: &HostDownError{Host: host, Since: m.time(m.run.streakFrom), Last: m.run.lastFailure, Retry: m.time(d.next)}}
}

// failures is the estimator of what fails: the share of the host's answers
// that failed, over about failMemory of them, and the run of failures in a
// row that may make it down, with what the host took and how it was held
// before the run.
type failures struct {
	streak     int32
	streakSeq  uint32 // the first ticket sent after the run began
	streakFrom instant
	older      int16 // attempts sent before the run began, still in flight: they may yet succeed
	// chances is how many failures of the run were of attempts sent after
	// its first came back, and one for those sent before: the chances the
	// host had, where the answers of one burst, sent before any came
	// back, are one.
	chances     int16
	tallied     uint8 // answers in failShare, up to failMemory
	knownBefore uint8 // tallied before the run
	reachable   bool  // some failure of the run had a connection
	together    bool  // some failure of the run was of an attempt sent while another was on its way
	lastFailure string
	rateBefore  float32 // what the host accepted in the second before the run
	ctlBefore   holding // how it was held before the run
	failShare   float64 // the share of its answers that failed, over about failMemory
	shareBefore float64 // failShare before the run
}

// observe: an answer that got through ends the run; one that did not,
// but for a refusal by which the host says it limits the rate (it is up),
// adds to it. Each counts in the share but while the host is down.
func (f *failures) observe(s *sample) {
	switch s.out {
	case accepted, served:
		f.streak = 0
		f.tally(false)
	case refused, failed:
		if s.limits {
			return
		}
		f.failure(s)
		if s.state != HostDown {
			f.tally(true)
		}
	}
}

// released takes an answered attempt of ticket seq out of those sent
// before the run that may still get through.
func (f *failures) released(seq uint32) {
	if f.streak > 0 && seq < f.streakSeq {
		f.older = max(f.older-1, 0)
	}
}

// failure adds an answer that got nothing through to the run that may make
// the host down.
func (f *failures) failure(s *sample) {
	if f.streak == 0 {
		f.streakFrom, f.streakSeq, f.reachable, f.together, f.chances = s.at, s.nextSeq, false, false, 0
		// Attempts sent before this one, still in flight, may yet get
		// through: the host is not down while they may.
		f.older = int16(min(s.inflight, math.MaxInt16))
		// What the host took before the run, to be paced at when it comes
		// back; for a record just made, the process's rate bounds it.
		f.rateBefore = float32(s.accepted)
		if s.fresh {
			f.rateBefore = max(f.rateBefore, float32(s.sentAll))
		}
		// What the run does to the pace is not what the host took: the
		// run may be an outage's first seconds, taken for overload.
		f.shareBefore, f.knownBefore, f.ctlBefore = f.failShare, f.tallied, s.held
	}
	if (f.streak == 0 || s.sent.After(f.streakFrom)) && f.chances < math.MaxInt16 {
		f.chances++
	}
	f.streak++
	f.reachable = f.reachable || !s.sig.Unreachable
	f.together = f.together || s.overlap
	f.lastFailure = s.sig.describe()
}

// falls reports whether the run of failures makes the host down: nothing
// got through, nothing sent before the run is still on its way, and the
// run is long enough: downFailures when no connection could be made at
// all, or over downAfter; downRun when each was sent after the last was
// answered.
func (m *hostModel) falls(now instant) bool {
	f := &m.run
	if f.streak < downFailures {
		return false // shorter than any run needed (runNeeded's logarithm is not worked out on every answer)
	}
	need := f.runNeeded()
	run := f.streak
	if f.reachable {
		// A host that answered is down only when it had chances to show
		// it is not: attempts sent after the run's first failure came
		// back. The answers of a burst sent before are one (a bucket
		// refuses at once all it cannot take): 20 refusals of a
		// bucket's burst, then one attempt its replica failed a second
		// later, made a bucket of 20/s before a replica failing 10 %
		// down, and 351 of 400 pages were handed back
		// (TestBucketBurstBeforeFlakyReplicaNotDown).
		run = int32(f.chances)
	}
	if int(run) < need || f.older > 0 || m.ghostsAwaited(now) {
		return false
	}
	span := now.Sub(f.streakFrom)
	return !f.reachable || span >= downAfter || (int(f.streak) >= max(downRun, need) && !f.together && span > 0)
}

// ghostsAwaited reports whether attempts sent before the record was made
// may still be on their way to the host: they may yet get through, as
// older ones of the run do. A host whose answers take longer than downAfter
// (a limit in flight of slow requests) refuses what comes beyond its limit
// at once while it serves the rest: its first answers are all refusals,
// and taking it for down handed back every request until the first of
// those it served came back. ghosts counts what the whole process had on
// its way, so it is awaited for ghostWait at most.
func (m *hostModel) ghostsAwaited(now instant) bool {
	return m.ghosts >= 1 && now.Sub(m.since) < ghostWait
}

// runNeeded is the shortest run of failures that makes the host down: a
// run its share of failures before the run makes unlikely.
func (r *failures) runNeeded() int {
	f := r.shareBefore
	if r.knownBefore < downFailures && r.reachable {
		// Too few answers before the run to know its share: failures that
		// had a connection may be a flaky host's first. Connections refused
		// from the first are a dead address.
		f = freshShare
	}
	if f <= 0 {
		return downFailures
	}
	if f >= 1-1/float64(failMemory) {
		f = 1 - 1/float64(failMemory) // it failed all it remembers: one run of the memory's length
	}
	return max(downFailures, int(math.Ceil(math.Log(unlikely)/math.Log(f))))
}

// tally adds an answer to the share of answers that failed.
func (f *failures) tally(failed bool) {
	x := 0.0
	if failed {
		x = 1
	}
	// The mean of the answers so far, until there are failMemory of them:
	// a share that starts at 0 would read a host failing from its first
	// answers as one that fails little.
	f.tallied = min(f.tallied+1, failMemory)
	f.failShare += (x - f.failShare) / float64(f.tallied)
}

// fall: any → Down. The host is handed back at once but for its probes,
// one every probeEvery; requests waiting for a slot in flight learn of it.
func (m *hostModel) fall(ev *changes, now instant) {
	m.down = &outage{next: now.Add(probeEvery), oldRate: float64(m.run.rateBefore), oldCtl: m.run.ctlBefore}
	m.run.failShare = m.run.shareBefore // what the host failed before it was down
	m.move(toFall, now)
	m.wake(now)
	ev.add(change{kind: evDown, since: m.time(m.run.streakFrom), last: m.run.lastFailure})
}

// recover: Down → Recovering, at the rate the host took before, or what
// the callers asked of it meanwhile when that is less; its old pace, if it
// had one, when it was overloaded.
func (m *hostModel) recover(ev *changes, now instant) {
	r := m.down.oldRate
	if asked := m.down.turnedAway.lastSecond(now); asked > 0 && (r == 0 || asked < r) {
		r = asked
	}
	was := m.down.oldCtl
	m.down = nil
	m.run.streak = 0
	m.ctl = control{step: probeStep}
	if r == 0 && was.rate == 0 && was.limit == 0 {
		// Nothing is known of what it takes: it never served, nor was
		// asked anything meanwhile. It is not held back on a guess.
		m.move(toReturn, now)
		ev.add(change{kind: evBack})
		return
	}
	if was.rate > 0 || was.limit > 0 {
		m.ctl.rate, m.ctl.limit, m.ctl.ceil = float64(was.rate), was.limit, float64(was.ceil)
	} else {
		m.ctl.rate = max(r, 1/holdTime.Seconds())
	}
	m.ctl.burst = max(1, int32(m.ctl.rate*horizon.Seconds()))
	m.ctl.grownAt, m.ctl.busyAt = now, now
	m.move(toRecover, now)
	ev.add(change{kind: evBack, to: m.ctl.rate})
}
