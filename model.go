package retryhttp

import (
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// The host model: what each host's answers say of it, one state machine per
// host, kept by the in-process Limiter (a Limiter of another kind may keep
// it elsewhere). The Transport reads each answer (observe, in observe.go)
// and tells the Limiter what it got (Learn); the Limiter holds
// what follows until the next answer: a pace, a limit on what is in flight,
// a host handed back at once. Each answer is made into a sample and told
// to the model's estimators (estimators.go), which keep what they need of
// it and decide nothing; the transitions below read them.
//
// A host is in one of five states:
//
//	Healthy     nothing is known against it: no record, no cost. Every
//	            host starts here, and returns here once forgotten.
//	Failing     some answers fail, and load does not explain it (a broken
//	            replica, a flaky gateway, one broken endpoint): it is
//	            retried at full speed and never slowed.
//	Overloaded  its refusals grow with what it is sent (a rate limit,
//	            announced or not, or a limit on what it serves at once):
//	            it is paced at what it accepts, as a rate or as a limit on
//	            what is in flight, and the pace grows back while it binds
//	            and the host answers well.
//	Down        nothing gets through (an outage, a dead address): a
//	            request is handed back at once with ErrHostDown, but for one
//	            probe at a time, every probeEvery.
//	Recovering  back from Down: paced at what it took before the outage, so
//	            that the callers' backlog is not flushed at it; the pace
//	            grows while it binds, and goes once it holds nothing back.
//
// The transitions, each named where it is made:
//
//	fail      Healthy → Failing             a failure that load does not explain
//	overload  Healthy, Failing → Overloaded a refusal that load explains (below)
//	checkCut  Overloaded → Failing          a cut that bound did not move the share
//	                                        refused: chance, not load (a host paced
//	                                        before keeps the pace the cut gave it)
//	fall      any → Down                    only failures for downAfter, downFailures
//	                                        of them or more (at once when no
//	                                        connection could be made), in a run
//	                                        the share it failed before makes
//	                                        unlikely (see unlikely), with
//	                                        nothing sent before it still on
//	                                        its way (ghostWait)
//	recover   Down → Recovering             an answer gets through (the probe's)
//	settle    Overloaded, Recovering → Healthy  the pace holds nothing back
//	heal      Failing → Healthy             nothing gone wrong for forgetAfter, the
//	                                        record kept (busy, or its latencies kept)
//	forget    any → Healthy                 nothing heard of the host for forgetAfter,
//	                                        or nothing gone wrong for it
//
// A refusal (a 429, a 503 or 529 that names no wait) is explained by load
// when the host says so (a 429), when it came with more in flight than the
// host accepted at once lately (a limit on what is in flight), or when the
// host refused more than it accepted of what it was sent in the last
// second (Google SRE's client-side throttling: requests beyond twice the
// accepts) while more than one attempt was in flight: nothing sent one at a
// time overloads a host's capacity. What is sent one at a time can still
// come too soon for a rate: refusals that come sooner after an accepted
// attempt than accepted ones do are load too (spacing, in
// model_spacing.go). Once a cut has shown that the host refuses a share
// whatever the load, only refusals beyond that share are load. A
// host that announces its quota (X-RateLimit-*,
// RateLimit-*) says what it accepts: it is held to what it says remains,
// until its reset (see quota). Whatever explains it, a refusal that comes
// back while what was sent before the record is still on its way holds
// the refused for one of those answers (holdForAnswer): the first
// accepted answer ends the hold, or, sent with the refused and come well
// after them, makes it the host's limit in flight.

// The model's constants, each with its reason.
const (
	// downAfter is how long only failures make a host down. A host that
	// serves as little as one request a second lets one through in that
	// time; a host slower than that says so with a Retry-After, which
	// parks it instead.
	downAfter = time.Second
	// ghostWait is how long the attempts sent before a host's record are
	// awaited before a run of failures makes it down (ghostsAwaited): a
	// slow API's answers take a few seconds, and a dead address's attempts
	// fail at once, so those still out after 10 s are most likely other
	// hosts' in a busy process.
	ghostWait = 10 * time.Second
	// downFailures is the fewest failures in a row that make a host down:
	// the tries of one request with the default attempts, so that a single
	// failed request never takes a host off line.
	downFailures = 3
	// aboveOKRun is how many refusals in a row of attempts sent with more
	// in flight than the host accepted at once lately explain them as a
	// limit on what it serves at once (countAboveOK): the tries of one
	// request less one, so that a request refused so on each try is held
	// for a slot on its last instead of lost. Fewer takes a host refusing
	// half at random for a limit on one run of new load in two.
	aboveOKRun = downFailures - 1
	// downRun is a run of failures that makes a host down without waiting
	// for downAfter, when each was sent after the one before was answered:
	// a host failing half its answers at random does that once in a
	// thousand runs. (A burst refused at once is not such a run: an
	// overloaded host refuses one.)
	downRun = 10
	// unlikely is how rare a run of failures must be, for the share of
	// answers the host failed before it, to make the host down: one in a
	// million. Taking a host that fails at random for down hands back
	// every request for a while, so the run must be one that its failures
	// make a few times a day at a thousand requests a second, with room
	// for the share to read low. A host that failed nothing needs
	// downFailures; one that fails 30% of its answers, 12; 60%, 28.
	unlikely = 1e-6
	// failMemory is how many answers the share of failures remembers (an
	// exponentially weighted mean): enough to read 80% within a tenth,
	// few enough that a host which got better is seen to within seconds.
	failMemory = 50
	// freshShare is the share of failures taken for a host that gave too
	// few answers to know its own, when its first answers fail: a quarter,
	// so that a host answering 503 to everything from its first request is
	// down after a run of 10 (one that refused every connection, after
	// downFailures), and one failing 80% at random from its first is taken
	// for down one time in eight, until its next probe gets through.
	freshShare = 0.25
	// probeEvery is how often a down host is tried: its return is seen
	// within half a second, and a dead address costs two connection
	// attempts a second whatever the callers ask.
	probeEvery = 500 * time.Millisecond
	// overloadRatio is Google SRE's K: a host that accepted less than
	// 1/overloadRatio of what it was sent is over its capacity (SRE book,
	// "Handling Overload", client-side throttling).
	overloadRatio = 2
	// cutShare is what a cut keeps of what the host accepted: below it,
	// so that a queue that built up drains.
	cutShare = 0.9
	// nearShare is how close to the rate it refused a pace grows before it
	// stays a while: half way between the cut and the refusal.
	nearShare = (1 + cutShare) / 2
	// hold is how long the evidence of one change is awaited before the
	// next: the window of most rate limits. No pace is cut twice, or grown,
	// within it, and a pace is never cut below one attempt per hold.
	holdTime = time.Second
	// probeStep is the first step past the rate last refused, once the pace
	// has stayed just below it for 2 holds; each next step is three times
	// the last, so a host whose capacity rose is found within seconds.
	probeStep = 0.05
	// forgetAfter is how long a host that nothing went wrong with, or that
	// nothing was asked of, keeps its record: then it is Healthy again.
	forgetAfter = time.Minute
	// horizon is how far ahead a learned pace hands out its slots: a
	// request asks again after it, so that requests already waiting get a
	// pace that has grown meanwhile.
	horizon = 250 * time.Millisecond
)

// hostModel is what the in-process limiter knows of one host that failed,
// refused or announced a quota. It is guarded by its shard's lock.
type hostModel struct {
	epoch       *time.Time // the limiter's: the instants count from it (instant.go)
	since       instant
	seen        instant // last asked or answered
	lastTrouble instant // last refusal or failure
	lastLoad    instant // last refusal that load explained
	gen         uint32  // tells this record's tickets from an earlier one's
	state       HostState
	says429     bool // it refused saying it limits the rate (a 429): its bare 503s are not its limit's

	// What went out and came back.
	inflight     int32  // attempts with a ticket, sent and not answered
	seq          uint32 // tickets handed out
	sent         sliding
	accepts      sliding // answers not refused, with or without a ticket
	refusals     sliding
	answered     instant // when the last answer came, and when it was sent
	answeredSent instant
	exShare      float32 // the share it refused after cuts that did not lower it
	ghosts       float32 // attempts sent before the record, still on their way, at most (while fresh)

	// The estimators (estimators.go), each fed every answer.
	run   failures // the share of failures, and the run that may make the host down (model_down.go)
	ctl   control  // how the host is held, and the check of a cut (model_pace.go)
	loads loads    // what was in flight when it accepted and refused (model_slots.go)
	gaps  spacing  // when the attempts sent alone were refused (model_spacing.go)
	q     *quota   // once the host announced one (model_quota.go)

	down *outage // while it is Down

	// The requests waiting for a slot in flight, in the order they came,
	// and those a slot is kept for (queue.go).
	wq *waitQueue
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// newModel starts the record of a host at its first failure, refusal or
// announcement.
func newModel(gen uint32, epoch *time.Time, t time.Time) *hostModel {
	m := &hostModel{gen: gen, epoch: epoch}
	m.since = m.at(t)
	m.seen = m.since
	return m
}

// ticket is a reservation's stamp: the record it belongs to, the attempt's
// sequence number, and how many were in flight with it, itself included.
func ticket(gen, seq uint32, load int) uint64 {
	return uint64(gen)<<40 | uint64(seq)<<8&(1<<40-1) | uint64(min(load, 255))
}

func ticketParts(t uint64) (gen, seq uint32, load int) {
	return uint32(t >> 40), uint32(t>>8) & (1<<32 - 1), int(t & 255)
}

// send counts an attempt the limiter let go, and returns its ticket.
func (m *hostModel) send(now instant) uint64 {
	m.seq++
	m.inflight++
	m.sent.add(now)
	m.seen = now
	return ticket(m.gen, m.seq, int(m.inflight))
}

// release takes an answered (or unsent) attempt out of what is in flight,
// and says whether it was one of this record's, with its load and sequence.
func (m *hostModel) release(t uint64) (tracked bool, load int) {
	gen, seq, load := ticketParts(t)
	if t == 0 || gen != m.gen {
		return false, 0
	}
	m.inflight = max(m.inflight-1, 0)
	m.run.released(seq)
	return true, load
}

// answer takes in what an attempt got, at now (sig.Now as an instant of
// the record, which its caller has made already), tells every estimator
// of it, and makes the transition it calls for. It is the model's one
// entry for answers.
func (m *hostModel) answer(sig *Signal, now instant, ev *changes) {
	tracked, load := m.release(sig.Ticket)
	defer m.wake(now) // a slot freed, or a limit changed: the waiters first
	if !tracked && !sig.Canceled && (sig.Status != 0 || sig.Failed) {
		m.ghosts = max(m.ghosts-1, 0)
		if m.ghosts < 1 {
			m.ctl.untold = false // what was sent before the record is all answered
			if m.ctl.held && m.inflight == 0 {
				m.letGoNow(now) // no answer left to wait for
			}
		}
	}
	o := sig.outcome()
	if o != saysNothing {
		switch {
		case sig.limits():
			m.says429 = true
		case o == refused && m.says429 && sig.Status == http.StatusServiceUnavailable:
			// A host whose limit says so (a 429) does not limit with a
			// bare 503 too: that one is its application's, a broken
			// replica's behind the limiter, and says nothing of the rate.
			// (A 529 is Anthropic's overload, beside its 429s: still a
			// refusal.)
			o = served
		}
	}
	// Sent while another was on its way: before the last answer came, or
	// with the attempt that brought it.
	sentAt := now.Add(-sig.Latency)
	s := sample{sig: sig, ev: ev, at: now, sent: sentAt, out: o, load: load, tracked: tracked,
		overlap: load > 1 || (!tracked && (sentAt.Before(m.answered) || sentAt.Equal(m.answeredSent))),
		limits:  sig.limits(), fresh: m.fresh(now), state: m.state,
		inflight: m.inflight, nextSeq: m.seq + 1, rate: m.ctl.rate, bound: now.Sub(m.ctl.busyAt) < holdTime,
		since: m.since}
	if sig.Limit > 0 {
		m.learnQuota(&s)
	}
	if o == saysNothing {
		return
	}
	m.seen = now
	m.answered, m.answeredSent = now, sentAt
	switch o {
	case refused:
		m.refusals.add(now)
	case accepted, served:
		m.accepts.add(now)
	}
	if m.run.streak == 0 && !s.limits && (o == refused || o == failed) {
		// A run of failures begins: it remembers what the host took and
		// how it was held before it.
		s.accepted, s.sentAll, s.held = m.accepts.lastSecond(now), sig.Sent, m.ctl.holding()
	}
	m.observe(&s)
	m.transition(&s)
	if m.state != HostDown && m.falls(now) {
		m.fall(ev, now)
	}
	m.heal(now)
}

// transition makes the change of state an answer calls for, its
// estimators told of it.
func (m *hostModel) transition(s *sample) {
	now, sig, ev := s.at, s.sig, s.ev
	switch s.out {
	case accepted, served:
		if s.out == accepted && m.ctl.held {
			m.tookSlot(ev, now, s.tracked)
		}
		if m.state == HostDown {
			m.recover(ev, now)
		}
		if s.out == served {
			m.lastTrouble = now
			m.fail(now)
		}
	case refused:
		m.lastTrouble = now
		if !s.tracked && m.state != HostDown {
			m.holdForAnswer(now)
		}
		switch {
		case m.state == HostDown:
		case m.spentQuota(sig):
			// The host said its quota is spent: the quota explains the
			// refusal and holds the host to its reset; no rate of ours
			// is learned beside it.
			m.move(toOverload, now)
		case m.explained(sig, s.overlap):
			m.overload(ev, sig, s.tracked, s.load, s.overlap)
		default:
			m.fail(now)
		}
	case failed:
		m.lastTrouble = now
		if m.state != HostDown {
			m.fail(now)
		}
	}
}

// spentQuota reports a refusal whose answer says the host's announced
// quota is spent: none remain, and the quota says when they do again.
func (m *hostModel) spentQuota(sig *Signal) bool {
	return m.q.active() && !m.q.sliding && m.q.window > holdTime && sig.Limit > 0 && sig.Remaining == 0 && m.ctl.rate == 0 && m.ctl.limit == 0
}

// heal: Failing → Healthy, once nothing went wrong for forgetAfter. A
// record kept while the host is busy (requests always in flight, or its
// latencies kept for hedging) is not forgotten, so the state must mend in
// place.
func (m *hostModel) heal(now instant) {
	if m.state == HostFailing && now.Sub(m.lastTrouble) >= forgetAfter {
		m.move(toHeal, now)
		m.exShare = 0
	}
}

// fail: Healthy → Failing. A failing host is not slowed.
func (m *hostModel) fail(now instant) {
	if m.state == HostHealthy {
		m.move(toFail, now)
	}
}

func later(a, b instant) instant {
	if a.After(b) {
		return a
	}
	return b
}

// fresh reports whether the record is a hold old or less: what it hears
// of is still the burst that made it.
func (m *hostModel) fresh(now instant) bool { return now.Sub(m.since) < holdTime }

// pace is the learned pace, unlimited when none.
func (m *hostModel) pace() Pace {
	if m.ctl.rate > 0 {
		return newPace(rate.Limit(m.ctl.rate), int(max(m.ctl.burst, 1)))
	}
	if r := m.q.paceRate(); r > 0 {
		// The rate the host announces, a window's quota at once: what
		// remains of it is held apart (quotaWait).
		return newPace(rate.Limit(r), int(m.q.limit))
	}
	return Pace{Limit: rate.Inf}
}

// status says what the record knows, for Learn's caller.
func (m *hostModel) status() HostStatus {
	s := HostStatus{State: m.state, Since: m.time(m.since), Pace: m.pace()}
	if !m.ctl.held {
		s.InFlight = int(m.ctl.limit) // a fresh record's hold for an answer is no limit of the host's
	}
	if m.state == HostDown {
		s.Retry = m.time(m.down.next)
	}
	return s
}

// expiredAt reports whether the record can be forgotten at now: nothing is in
// flight, it is not down or holding a pace (unless nobody asked for the
// host lately), and nothing went wrong with the host for forgetAfter.
func (m *hostModel) expiredAt(now instant) bool {
	if m.inflight > 0 && now.Sub(m.seen) < forgetAfter {
		return false
	}
	if now.Sub(m.seen) >= forgetAfter {
		return true
	}
	if m.state == HostDown || m.ctl.rate > 0 || m.ctl.limit > 0 || (m.q.active() && m.q.tokens(now) < 1) {
		return false
	}
	return now.Sub(m.lastTrouble) >= forgetAfter && (!m.q.active() || now.Sub(m.q.at) >= forgetAfter)
}
