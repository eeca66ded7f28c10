package retryhttp

import (
	"math"
	"time"
)

// control is how an overloaded or recovering host is held: a rate, or a
// limit on what is in flight, and what the model knows of where the host
// refuses.
type control struct {
	rate      float64 // attempts a second; 0: no pace
	ceil      float64 // what the host accepted when it last refused (a rate, or a count in flight); 0: unknown
	step      float64 // the next step past ceil
	burst     int32
	limit     int32 // attempts in flight; 0: no limit
	holdUntil instant
	grownAt   instant
	nearAt    instant // when the pace reached just below ceil
	busyAt    instant // when a request last waited for the pace or a slot

	// A cut of a burst sent before the host had a record.
	notBefore instant // the pace's first slot after that cut
	guess     int32   // what the host took at once in that burst: a limit in flight to try
	acked     int32   // accepted answers since the limit last grew
	burstCut  bool    // the last cut was of such a burst
	tried     bool    // the guess was tried
	cutBound  bool    // the pace bound since the cut
	slow      bool    // nothing is known of the rate since a burst refused: the pace doubles each hold (slow start)
	// held is set while the limit in flight is a fresh record's hold for
	// an answer (holdForAnswer), and untold while it counts the attempts
	// sent before the record, still on their way (from its hold, until
	// they are all answered).
	held, untold bool
	// parkedFor is the longest wait over a hold that a refusal of this
	// overload named, in whole seconds: a probe refused costs every
	// caller that wait (a count that names its window), so the pace stays
	// just below ceil probeCost times as long before it probes.
	parkedFor  uint8
	before     float64 // the rate to return to when a limit in flight is refuted, and its ceil
	beforeCeil float64

	// The check of a cut (checkCut).
	cutAt      instant
	cutBefore  [2]float32 // the answers before the cut, and the refusals among them
	lowered    [2]float32 // the answers since a cut that lowered the share refused, and the refusals
	cutAnswers float32    // answers to attempts sent since the cut, and the refusals among them (whole counts: exact)
	cutRefused float32
	cutFrom    float64 // the pace before the cut; 0: none
	heldAt     instant // when the host was first held for an answer (holdForAnswer)
}

// holding is what a record keeps of a control while the host is down: what
// it is paced at again when it comes back.
type holding struct {
	rate, ceil float32 // a float32 holds all a rate says, and keeps the record in its size class
	limit      int32
}

func (c *control) holding() holding {
	return holding{rate: float32(c.rate), ceil: float32(c.ceil), limit: c.limit}
}

// observe counts the answers to attempts sent since a cut (but refusals
// by which the host says it limits the rate, which are its word, not a
// share, and failures, which no pace explains), for its check (checkCut),
// and grows a limit in flight with what it accepts (acked1).
func (c *control) observe(s *sample) {
	if !c.cutAt.IsZero() && s.sent.After(c.cutAt) && !s.limits && s.out != failed {
		c.cutAnswers++
		if s.out == refused {
			c.cutRefused++
		}
	}
	if s.tracked && s.out == accepted {
		c.acked1(s.at)
	}
}

// acked1 grows a limit in flight below what the host took at once by one
// for every limit's worth of accepted answers, while requests wait for it.
func (c *control) acked1(now instant) {
	if c.limit == 0 || float64(c.limit) >= c.ceil-1 || now.Sub(c.busyAt) >= holdTime {
		return
	}
	if c.acked++; c.acked >= c.limit {
		c.limit, c.acked = c.limit+1, 0
		if float64(c.limit) >= c.ceil-1 {
			c.nearAt = now
		}
	}
}

// explained reports whether load explains a refusal (see the package
// comment above): the host says so, or it came with more in flight than
// the host accepted at once, or the host refused more than it accepted of
// a burst.
func (m *hostModel) explained(sig *Signal, overlapped bool) bool {
	now := m.at(sig.Now)
	if sig.limits() || m.state == HostOverloaded {
		return true
	}
	if overlapped && m.exShare == 0 && m.loads.aboveOK >= aboveOKRun {
		// Refused, aboveOKRun times in a row, what was sent with more
		// in flight than the host accepted at once lately: a limit on
		// what it serves at once, however small the share refused (one
		// caller of six, beside five that fill the slots again as each is
		// answered, is refused every try: 15 % of what the host is sent,
		// which read as a host failing at random, and lost its pages).
		return true
	}
	// A host that refuses a share at random whatever the load (exShare,
	// once cuts showed that) accepts the rest of what it is sent: it is
	// overloaded when it accepts less than 1/overloadRatio of that.
	sent := m.sentLastSecond(sig)
	if overlapped && m.fresh(now) && m.exShare == 0 {
		// A record a hold old or less counts from the host's first
		// refusal: what the second before it brought, a burst accepted
		// whole, is not what the host takes now. Refused more than
		// overloadRatio times as often as it accepted since, the host is
		// over its capacity (a bucket of 14/s with a burst of 28, spent
		// by 5 callers in 0.2 s, was paced 1.0-1.4 s after its first
		// refusal, the burst hiding it: pages lost, three tries refused
		// in that second). What is still on its way counts as accepted:
		// a refusal comes back sooner than a page, and a replica failing
		// one in five at once is not overloaded by the 24 it still
		// serves. One accepted at least: a host that accepts none is
		// out, not over its capacity, and its run of failures says so
		// (fall).
		if a, r := m.accepts.lastSecond(now), m.refusals.lastSecond(now); a >= 1 && r >= downFailures && r > overloadRatio*(a+float64(m.ghosts)+float64(m.inflight)) {
			return true
		}
	}
	if m.exShare == 0 && m.gaps.closer() {
		// Attempts sent alone were refused when they came soon after one
		// the host accepted, and accepted after a wait: a rate, tried by
		// the cut (checkCut).
		return true
	}
	return overlapped && (1-float64(m.exShare))*sent > overloadRatio*(sent-m.refusals.lastSecond(now))
}

// sentLastSecond is what the host got in the last second: what was counted
// for it, or, until it has been counted a second, what the process sent to
// every host, of which it got at most all.
func (m *hostModel) sentLastSecond(sig *Signal) float64 {
	now := m.at(sig.Now) // once: a time.Time's subtraction costs as much as the counts
	sent := m.sent.lastSecond(now)
	if m.fresh(now) {
		sent = max(sent, sig.Sent, m.accepts.lastSecond(now)+m.refusals.lastSecond(now))
	}
	return sent
}

// overload: → Overloaded, and the pace cut to what the host accepts, once a
// hold; or the limit in flight set to what it accepted at once, when it
// refused only beyond that. A refusal of the same burst after a cut may
// lower the pace further, to what it shows was accepted.
func (m *hostModel) overload(ev *changes, sig *Signal, tracked bool, load int, overlapped bool) {
	now, c := m.at(sig.Now), &m.ctl
	lastLoad := m.lastLoad
	m.lastLoad = now
	// What the host accepted in the last second: the answers that said
	// so, or, for a burst whose accepted answers came before the host had
	// a record, what it got less what it refused.
	sent := m.sentLastSecond(sig)
	accepted := max(sent-m.refusals.lastSecond(now), m.accepts.lastSecond(now), 0)
	if sig.Wait > 0 {
		if m.accepts.lastSecond(now) == 0 && m.refusals.lastSecond(now) <= 1 {
			// The one answer in a second, a refusal with a wait named:
			// the host is spent for that wait (it is parked) by what it
			// was sent before the quiet; it says nothing of its rate.
			m.lastLoad = lastLoad
			return
		}
		accepted = max(accepted, 1/sig.Wait.Seconds())
		if sig.Wait > holdTime && !m.q.active() {
			c.parkedFor = max(c.parkedFor, uint8(min(math.Ceil(sig.Wait.Seconds()), math.MaxUint8)))
		}
		if m.fresh(now) && sig.Wait > holdTime && !m.q.active() {
			// A burst, then a wait longer than a refill's rounding
			// (httprate names its whole window): what the host granted
			// lasts it that wait, and is its rate.
			accepted = max(accepted/sig.Wait.Seconds(), 1/sig.Wait.Seconds())
		}
	}
	if m.state != HostOverloaded && m.state != HostRecovering {
		if sig.Wait <= 0 && !m.q.active() && (m.noise(now, sent) || m.lone(now)) {
			// One refusal among many accepted, naming no wait, from a
			// host that announces nothing, says it was full for a moment,
			// not what it takes: a rate is cut at the second refusal
			// within a second, which a limit hit by our traffic sends at
			// once. (A refusal with a wait parks the host; a quota's
			// refusal tells the window's phase: both are read below.)
			m.lastLoad = lastLoad
			return
		}
		m.move(toOverload, now)
		held := *c
		*c = control{}
		if held.held {
			// A fresh record's hold for an answer stays its hold.
			c.limit, c.held, c.untold, c.heldAt = held.limit, true, held.untold, held.heldAt
		}
	}
	switch {
	case c.limit > 0 && !c.held && !tracked:
		return // a late answer of an attempt sent before the limit
	case c.limit > 0 && !c.held && load <= 1:
		// Refused with nothing else in flight: no limit in flight
		// explains that, a rate does.
		c.limit, c.burstCut, c.ceil = 0, false, c.beforeCeil
		if c.before > 0 {
			m.setRate(ev, c.before, now)
			c.holdUntil, c.grownAt, c.nearAt = now.Add(holdTime), now, now
			return
		}
		m.cutRate(ev, now, accepted, sent, false, false)
		return
	case c.limit > 0 && !c.held:
		// Refused with others in flight: one fewer at once. A limit one
		// above the host's loses one attempt per slot too many, once.
		c.limit = max(1, c.limit-1)
		c.ceil, c.holdUntil, c.grownAt, c.nearAt = float64(c.limit+1), now.Add(holdTime), now, now
		return
	case now.Before(c.holdUntil):
		if c.burstCut && m.fresh(now) {
			// Each refusal of the burst says more of what the host took
			// of it: the refusal the pace may grow back to.
			c.ceil = min(c.ceil, max(accepted, 1))
		}
		if c.burstCut && m.fresh(now) && c.rate > 0 && cutShare*accepted < c.rate {
			c.guess = min(c.guess, int32(math.Round(accepted)))
			if c.guess == 0 && overlapped {
				// The cut came with the burst's first refusal, before
				// it could tell it was a burst (a 429 is explained at
				// once): what the host took of it may be a limit in
				// flight, as in cutRate.
				c.guess, c.notBefore = int32(math.Round(accepted)), c.holdUntil
			}
			m.setRate(ev, max(cutShare*accepted, 1/holdTime.Seconds()), now)
		}
		m.spacedBurst(sig, accepted, sent, now)
		return
	case m.phaseRefusal(sig, sent):
		m.lastLoad = lastLoad
		return
	case c.rate > 0 && c.rate <= nearShare*c.ceil && m.noise(now, sent) && sig.Wait <= 0:
		// A lone refusal, among many accepted, at a pace the host took
		// before. Not one that names a wait: it parks the host, and the
		// next refusal comes a wait later, lone again, however often
		// the host refuses (a bucket fallen from 14/s to 8/s, paced at
		// 11.8/s, refused one request a second, each parking the host a
		// second, for four minutes: capacityChange:7 of the simulator).
		m.lastLoad = lastLoad
		return
	case c.rate > 0 && m.exShare > 0 && !m.beyondChance(now):
		m.lastLoad = lastLoad
		return // refusals at the share it refuses whatever the load
	}
	switch m.checkCut(ev, now, now.Sub(c.busyAt) < holdTime, holdTime) {
	case undecided:
		// Too few answers since the last cut to tell whether it helped:
		// no cut yet, and no growth either while the host refuses (lastLoad
		// stands). A pace that grew meanwhile raised the share refused
		// until the check read it unmoved, and took a 14/s bucket's
		// refusals, under a pace of 20-25/s, for chance
		// (TestBucketRefusalsNotChance failed one run in ten under -race).
		return
	case byChance:
		return // the cut a hold ago did not move the share it refuses
	}
	m.cutRate(ev, now, accepted, sent, m.fresh(now), overlapped)
	if sig.limits() {
		c.cutAt = 0 // the host said it limits the rate: nothing to check
	}
	m.spacedBurst(sig, accepted, sent, now)
}

// spacedBurst: of a burst sent at once, the host took one or two and
// refused the rest (nginx's limit_req without a burst): it spaces what it
// takes, and what it took says nothing of how close; the pace doubles each
// hold while nothing is refused (slow start, grow), where from a ceil of
// one or two it crept up for seconds (10/s took 18 s for 100 pages). A
// burst is six sent in the second or more: two callers, one refused and
// retried at once, are not one, and their slow start's doubling past a
// 3/s bucket met the last try of the page refused twice at its opening
// (TestSlowPaceSeenToBind failed one run in three).
func (m *hostModel) spacedBurst(sig *Signal, accepted, sent float64, now instant) {
	c := &m.ctl
	if m.fresh(now) && c.burstCut && accepted <= 2 && m.refusals.lastSecond(now) >= downFailures && sent >= 2*downFailures && !m.q.active() &&
		(c.limit == 0 || c.held) && sig.Wait <= holdTime {
		c.ceil, c.slow = 0, true
	}
}

// phaseRefusal reports a lone refusal by a sliding count, with a wait
// named, of a pace at the rate the count announces, and moves the pace's
// next slot half an interval off the refused attempt's. Such a count
// holds the same count at each attempt of a pace at its rate, and refuses
// them all or none by where they fall in its intervals: in the first
// half after its window opens, its rounded count reaches the limit. The
// refusal says the pace falls there; half an interval later it falls in
// the other half, whatever the latency to the host (the shift is from
// the refused attempt, on the same path). The rate the host announced
// is kept: cutting it would only bring the pace back to the same phase.
func (m *hostModel) phaseRefusal(sig *Signal, sent float64) bool {
	q, now := m.q, m.at(sig.Now)
	r := q.paceRate()
	if p := float64(m.pace().Limit); !q.active() || !q.counts || sig.Wait <= 0 || r <= 0 || m.fresh(now) || !m.noise(now, sent) ||
		p < r*cutShare || p > r/cutShare {
		return false // not a pace at the rate the count announces
	}
	d := time.Duration(float64(time.Second) / r)
	if d > holdTime {
		return false // the shift would add more than a hold to the wait named
	}
	slot := now.Add(-sig.Latency).Add(d / 2)
	if back := now.Add(sig.Wait); slot.Before(back) {
		slot = slot.Add((back.Sub(slot) + d - 1) / d * d)
	}
	m.ctl.notBefore = later(m.ctl.notBefore, slot)
	return true
}

// beyondChance reports refusals in the last second more than the share
// the host refuses whatever the load (exShare) makes likely: over two
// standard deviations, and one, above it.
func (m *hostModel) beyondChance(now instant) bool {
	r := m.refusals.lastSecond(now)
	n, f := r+m.accepts.lastSecond(now), float64(m.exShare)
	return r > f*n+2*math.Sqrt(n*f*(1-f))+1
}

// lone reports the one refusal of the last second, with nothing accepted
// in it: no rate can be read from it, and a limit our traffic hits sends
// a second at once (a host taking 500 a second whose first answer was a
// 429 was paced at 1 a second, and served 7 in its first 5 s).
func (m *hostModel) lone(now instant) bool {
	return m.refusals.lastSecond(now) < 2 && m.accepts.lastSecond(now) < 1
}

// noise reports refusals too few to say the pace is too fast: one in a
// second, among more than overloadRatio times as many sent.
func (m *hostModel) noise(now instant, sent float64) bool {
	r := m.refusals.lastSecond(now)
	return r < 2 && r*overloadRatio < sent
}

// cutRate paces the host at cutShare of what it accepted.
func (m *hostModel) cutRate(ev *changes, now instant, accepted, sent float64, burst, overlapped bool) {
	c := &m.ctl
	target := cutShare * accepted
	if p := m.pace(); !p.Unlimited() {
		target = min(target, cutShare*float64(p.Limit)) // below the pace it refused
	}
	// A pace grown past the rate the host last refused, after holds below
	// it with nothing refused, met refusals: the load that the probe added
	// caused them. Such a cut is not checked for chance: a host that
	// refuses at random would have refused below the ceil too, and a probe
	// that ran on tokens a bucket saved meanwhile reads what it accepted
	// above its rate, so the cut keeps the pace past it and the share it
	// refuses looks unmoved (bucket503Bare:5 of the simulator).
	probed := c.ceil > 0 && c.rate > c.ceil && c.limit == 0
	c.ceil, c.burstCut, c.slow = accepted, burst, false
	if !c.held {
		c.limit = 0 // a fresh record's hold for an answer stays its hold
	}
	switch {
	case burst && overlapped:
		// What the host took of a burst at once may be a limit on what it
		// serves at once, not a rate: tried once it has answered. The
		// burst had what the host grants for now: the pace starts a hold
		// later.
		c.guess = int32(math.Round(accepted))
		c.notBefore = now.Add(holdTime)
	case !burst && c.guess == 0:
		c.guess = m.loads.okLoad.max(now) // the most it took at once lately
	}
	c.step, c.holdUntil, c.grownAt, c.nearAt = probeStep, now.Add(holdTime), now, 0
	if c.cutAt.IsZero() && !probed {
		// The first of a run of cuts is checked: did they lower the share
		// refused (exonerated)?
		c.cutAt, c.cutBound, c.cutAnswers, c.cutRefused, c.cutFrom = now, false, 0, 0, c.rate
		c.cutBefore = c.lowered
		if c.cutBefore[0] == 0 {
			r := m.refusals.lastSecond(now)
			c.cutBefore = [2]float32{float32(max(r+m.accepts.lastSecond(now), 1)), float32(r)}
		}
		c.lowered = [2]float32{}
	}
	m.setRate(ev, max(target, 1/holdTime.Seconds()), now)
}

// setRate changes the learned pace, and notes a change that matters.
func (m *hostModel) setRate(ev *changes, r float64, now instant) {
	c := &m.ctl
	old := c.rate
	c.rate, c.burst = r, 1
	if m.state == HostRecovering {
		c.burst = max(1, int32(r*horizon.Seconds()))
	}
	ev.pace(old, r)
}

// adjust runs before each attempt: it grows a pace that binds, settles one
// that holds nothing back, tries a guessed limit in flight, and clears a
// host the cut did not help.
func (m *hostModel) adjust(ev *changes, now instant) {
	c := &m.ctl
	if c.rate == 0 && c.limit == 0 {
		r := m.q.paceRate()
		if !m.q.active() || !m.q.spare || r <= 0 || now.Sub(c.busyAt) >= holdTime {
			return
		}
		// The announced pace binds and the host never ran out: it takes
		// more than it says. The pace is learned from here, and grows
		// while nothing is refused.
		c.step, c.grownAt = probeStep, now
		m.q.beyond = true
		m.setRate(ev, r, now)
		return
	}
	if m.q.active() && m.q.spare && !m.q.beyond && now.Sub(c.busyAt) < holdTime {
		// Held by a pace, the host never ran out for a window: what it
		// took of a burst, and what it announces, are not its rate.
		m.q.beyond, c.ceil, c.nearAt = true, 0, 0
	}
	every := holdTime
	if m.state == HostRecovering && c.ceil == 0 && c.limit == 0 {
		// Back, and nothing refused since: the pace doubles every horizon
		// while it binds (slow start), so that a host whose old rate was
		// little known is served at what it takes within a second or two.
		every = horizon
	}
	if now.Before(c.holdUntil) || now.Sub(c.grownAt) < every {
		if now.Sub(c.busyAt) < holdTime && !c.cutAt.IsZero() && !c.busyAt.Before(c.cutAt) {
			c.cutBound = true
		}
		return
	}
	defer func() { c.grownAt = now }()
	binds := now.Sub(c.busyAt) < m.bindWindow()
	if m.checkCut(ev, now, binds, 2*holdTime) == byChance {
		return
	}
	switch {
	case binds && c.guess > 1 && !c.tried && m.loads.held && !m.q.active() && c.rate > 0 && m.loads.latencies.known() &&
		float64(c.guess)/m.loads.latencies.p95().Seconds() > c.rate:
		// The burst's share may have been a limit on what the host
		// serves at once (it refused while it served ours; a host that
		// refuses with nothing of ours in hand limits something else):
		// try it, from what the pace has in flight up,
		// one more for every limit's worth of accepted answers (TCP's
		// congestion avoidance), and go back to the rate at the first
		// refusal of an attempt sent alone.
		c.tried, c.before, c.beforeCeil = true, c.rate, c.ceil
		c.limit, c.rate, c.ceil, c.acked = max(m.inflight, 1), 0, float64(c.guess)+1, 0
		ev.add(change{kind: evTryLimit, n: int(c.guess)})
	case binds && now.Sub(m.lastLoad) >= holdTime:
		m.grow(ev, now) // failures that load does not explain do not hold it back
	case !binds && now.Sub(m.lastTrouble) >= forgetAfter:
		// settle: the pace holds nothing back, and nothing went wrong for
		// long enough that what was learned is stale.
		ev.pace(c.rate, 0)
		m.ctl = control{}
		m.move(toSettle, now)
	}
}

// bindWindow is how recently a request must have waited for the learned
// pace for it to bind: a hold, or two of its intervals when they are
// longer. A pace of one a hold or slower makes its waiters wait about an
// interval each (they are told to ask again a horizon before their slot),
// so the latest wait is often a hold old or more while the pace binds, and
// a bucket of 3 a second paced at 1 a second after its first burst was
// never grown: 79 pages in 70 s (bucket429:44 of the simulator). A host
// that announces a quota is held to its rate by it, and waits on its
// reset: a hold (counted longer, a learned pace of one a second over
// ulule's 60 a minute took 1.39 times the ideal, where 1.2 is its gate).
func (m *hostModel) bindWindow() time.Duration {
	if r := m.ctl.rate; r > 0 && r < 2/holdTime.Seconds() && !m.q.active() {
		return time.Duration(2 / r * float64(time.Second))
	}
	return holdTime
}

// nearWait is how long a pace stays just below ceil before it probes past
// it: 2 holds, or probeCost times the longest wait over a hold a refusal
// of the host named.
func (c *control) nearWait() time.Duration {
	return max(2*holdTime, probeCost*time.Duration(c.parkedFor)*time.Second)
}

// probeCost is how many times the wait a refusal named the pace stays just
// below ceil before it probes past it: a probe refused then costs a
// quarter of the time it waited at most.
const probeCost = 4

// cutVerdict is what the answers to attempts sent since a cut say of it.
type cutVerdict uint8

const (
	unchecked cutVerdict = iota // no cut awaits its check
	undecided                   // too few answers since the cut to tell
	byLoad                      // the share refused fell, or grew: load explains it
	byChance                    // the share did not move: the host refuses it whatever the load
)

// checkCut is the check of the last cut, at the next cut or two holds
// after it. A cut that bound lowered what was sent; had load caused the
// refusals, the share refused falls; had the cut left the pace past the
// host's capacity, it rises. A share that does neither (the share since
// the cut less than one standard error below the share before it, and
// not one above; three refusals since at least) is chance; one between
// one and two below awaits more answers: a host that was not paced before is
// failing, not overloaded, and one that was keeps the pace the cut gave
// it. Refusals at that share (exShare) are not taken for load again until
// the record is forgotten. A cut that lowered the share is followed by
// the next with the share since it as what came before: what remains may
// be chance.
func (m *hostModel) checkCut(ev *changes, now instant, binds bool, after time.Duration) cutVerdict {
	c := &m.ctl
	if c.cutAt.IsZero() || c.limit > 0 || now.Sub(c.cutAt) < after {
		return unchecked
	}
	n, r := float64(c.cutAnswers), float64(c.cutRefused)
	if !c.cutBound && !binds {
		c.cutAt = 0
		return byLoad
	}
	if n < 2*downFailures {
		return m.undecided(now)
	}
	n0, r0 := float64(c.cutBefore[0]), float64(c.cutBefore[1])
	p := (r0 + r) / (n0 + n)
	se := math.Sqrt(p * (1 - p) * (1/n0 + 1/n))
	switch d := r0/n0 - r/n; {
	case d > 2*se:
		c.cutAt, c.lowered = 0, [2]float32{float32(n), float32(r)}
		return byLoad
	case -d > se:
		// A cut does not raise a share refused at random: the share
		// before it was that of the first refusals of a pace grown past
		// the host's capacity, which the cut left past it.
		c.cutAt = 0
		return byLoad
	case r < downFailures && d < 0:
		// Too few refusals to tell, at a share above the one before:
		// taken for load, as a pace past the capacity of a host that
		// takes a few a second refuses.
		c.cutAt = 0
		return byLoad
	case r < downFailures || d > se:
		// A share that fell, by more than one standard error but not
		// two, says neither: a cut that left the pace past a bucket's
		// rate lowers its share by that much, and was taken for chance
		// when too few answers could show it (the pace never cut again,
		// a share refused for the rest of the run).
		return m.undecided(now)
	}
	c.cutAt = 0
	m.exShare = float32(r / n)
	ev.add(change{kind: evChance, from: float64(m.exShare)})
	if c.cutFrom == 0 {
		m.ctl = control{}
		m.move(toChance, now)
		return byChance
	}
	c.holdUntil, c.grownAt = now, now
	return byChance
}

// undecided: the check of the cut waits for more answers, forgetAfter at
// most.
func (m *hostModel) undecided(now instant) cutVerdict {
	if now.Sub(m.ctl.cutAt) >= forgetAfter {
		m.ctl.cutAt = 0
		return byLoad
	}
	return undecided
}

// grow raises a pace or limit that binds: up to just below what the host
// accepted when it last refused, a while there, then faster and faster
// past it, in case the host can take more now.
func (m *hostModel) grow(ev *changes, now instant) {
	c := &m.ctl
	if c.limit > 0 {
		switch {
		case float64(c.limit) < c.ceil-1:
			return // it grows with its accepted answers (acked)
		case !c.nearAt.IsZero() && now.Sub(c.nearAt) < 2*holdTime:
			return
		case c.nearAt.IsZero():
			c.nearAt = now
			return
		default:
			c.limit += int32(c.step)
			c.step = min(2*c.step, float64(max(c.limit/2, 1)))
		}
		return
	}
	if (m.state == HostRecovering || c.slow) && c.ceil == 0 {
		m.setRate(ev, 2*c.rate, now) // nothing refused since it came back, or since the burst
		return
	}
	near := nearShare * c.ceil
	next := c.rate * 2
	switch {
	case m.q.active() && m.q.spare && c.ceil == 0:
		// The host says it has more than the pace takes: a quarter more
		// each hold until a refusal says where it ends. (Doubling
		// overshoots by as much, and the refusals of a hundred workers
		// there cost pages.)
		next = c.rate * spareGrowth
	case c.rate < near:
		next = min(next, near)
		if next >= near {
			c.nearAt = now
		}
	case !c.nearAt.IsZero() && now.Sub(c.nearAt) < c.nearWait():
		return
	default:
		next = c.rate * (1 + c.step)
		c.step = min(3*c.step, 1)
	}
	if m.q.active() && !m.q.beyond {
		if r := m.q.paceRate(); r > 0 {
			next = min(next, r)
		}
	}
	if c.cutFrom != 0 && next > c.cutFrom {
		// A pace grown past the one before the cut tells nothing of it;
		// one still below it is still the cut's, and the check of the
		// answers sent under it stands (cleared at any growth, the cuts
		// of a bucket before a replica failing at random with the same
		// bare 503 were never checked: each grew a hold later, and the
		// replica's refusals cut the pace to 1/s for minutes). The first
		// cut of a host paced at nothing before is checked still: it
		// decides whether load explains the refusals at all.
		c.cutAt = 0
	}
	m.setRate(ev, next, now)
}
