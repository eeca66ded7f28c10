package retryhttp

import "time"

// The limit in flight: what the host accepted and refused with how many
// of ours on their way (loads, the estimator), and a fresh record's hold
// of the refused for a slot (holdForAnswer), which becomes the host's
// limit in flight when the host refuses at once what it has no room for.
// The limit itself, and how it is cut and grown, is control's
// (model_pace.go).

// loads is the estimator of a limit on what the host serves at once: the
// most of ours it accepted at once lately, the refusals in a row of
// attempts sent with more in flight than that, a paced host's latencies
// (what it took at once, over them, says whether a limit in flight is
// worth trying), and whether it served one of ours while it refused
// others.
type loads struct {
	okLoad    twoSeconds // the most in flight at the send of an accepted attempt
	latencies *latencies // a paced host's, allocated at its first: a failing host keeps none
	aboveOK   uint8      // refusals in a row sent with more in flight than any accepted lately
	held      bool       // it served an attempt of ours while it refused others
}

// observe counts an accepted or refused answer of ours against the load
// it was sent with, and keeps what an accepted one says of the host.
func (l *loads) observe(s *sample) {
	if s.tracked && (s.out == refused || s.out == accepted) {
		l.countAboveOK(s.load, s.out == refused, s.at)
	}
	if s.out != accepted {
		return
	}
	if s.tracked && s.sig.Latency > 0 && (s.state == HostOverloaded || s.state == HostRecovering) {
		// Only a paced host's are read (adjust: is what it took at once
		// a limit in flight?): a failing one keeps none.
		if l.latencies == nil {
			l.latencies = new(latencies)
		}
		l.latencies.add(s.sig.Latency)
	}
	if s.tracked {
		l.okLoad.add(s.at, s.load)
	}
	if !s.tracked && !s.sent.After(s.since) && s.at.After(s.since) {
		// Sent before the host first refused, answered after: it held
		// this one while it refused others.
		l.held = true
	}
}

// countAboveOK counts the refusals in a row of attempts sent with more in
// flight (load, the attempt included) than the host accepted at once in
// the last two seconds; an answer that says otherwise (a refusal within
// that, an acceptance beyond it) starts the count again. A host that
// refuses a share at random makes a run of aboveOKRun with the chance of
// its share to that power (and its acceptances beyond the load end it);
// one that limits what it serves at once, every time.
func (l *loads) countAboveOK(load int, refused bool, now instant) {
	most := int(l.okLoad.max(now))
	switch {
	case refused && most >= 1 && load > most:
		l.aboveOK = min(l.aboveOK+1, aboveOKRun)
	case refused || load > most:
		l.aboveOK = 0
	}
}

// holdForAnswer: a refusal that came back while attempts sent before the
// record are still on their way, none of them answered yet, says the host
// has no room for more now, whatever it limits (slots it is busy with, or
// a burst it spent): the refused request is not sent again before one of
// those answers. A limit in flight of what is on its way holds it, and
// every request after it, first come first served (a host serving 7 slots
// of 0.9 s refused 6 of 13 callers at once, and their retries, 0 to 0.5 s
// later, were refused again while the slots were still busy: pages lost
// on their third refusal, inFlight:0 of the simulator). It is a hold for
// the record's first answers only: the first answer the host accepts ends
// it (a bucket refills, and what it takes is for the rest of the model to
// tell), unless it was sent with the refused ones and came well after
// them (slotsGap): then the host refuses at once what it has no slot for,
// and the hold is its limit in flight (tookSlot). Else it goes with the
// record's first hold (letGo).
func (m *hostModel) holdForAnswer(now instant) {
	c := &m.ctl
	if !m.fresh(now) || (c.limit > 0 && !c.held) || (c.rate > 0 && !c.held) || m.accepts.lastSecond(now) > 0 {
		return
	}
	if m.ghosts < 1 {
		// Nothing sent before the record is on its way: no answer to
		// wait for (an outage refuses them all, at once).
		if c.held {
			m.letGoNow(now)
		}
		return
	}
	if !c.held {
		c.heldAt = now
	}
	// What is on its way now: each refusal of the burst comes back and
	// leaves the attempts the host is busy with.
	c.limit, c.held, c.untold = max(int32(m.ghosts)+m.inflight, 1), true, true
	if c.rate == 0 {
		c.ceil = float64(c.limit) + 1 // not grown by its answers (acked1)
		c.step = 1
	}
}

// slotsGap is how long after the refusals that held the host an attempt
// sent with them must be accepted for the hold to be a limit in flight:
// slots busy for their service refuse what comes beyond them at once,
// where a bucket, a window or a replica failing at random refuses in the
// time it accepts, and the answers of one burst come back together, to
// within a network's jitter, which is well under this.
const slotsGap = 50 * time.Millisecond

// loneSlotsGap is slotsGap after a lone refusal, which says little of
// slots: callers in step with a host, whose one refusal was told after the
// other answers of its round, have the next round's answers come as long
// after it as the host takes to answer (tookSlot). Four times slotsGap
// tells a host answering within 200 ms from slots (a slower one in step
// may still be taken for them), and still finds slots busy that long.
const loneSlotsGap = 4 * slotsGap

// tookSlot is the host's first accepted answer during a hold for an
// answer: one sent before the record, accepted slotsGap or more after the
// refusals (loneSlotsGap after a lone refusal), makes the hold the
// host's limit in flight; any other ends it. Attempts sent undated on the
// calm path before the record look sent with the refusal, so a nested
// Transport whose 20 callers were in step with a 50 ms host took the next
// round's 200s for slots and held them to 9-15 in flight
// (TestNestedInnerNotCutByOne429 failed one run in four under -race); the
// longer gap costs the simulator's limits in flight about 6 % more draws.
func (m *hostModel) tookSlot(ev *changes, now instant, tracked bool) {
	c := &m.ctl
	gap := slotsGap
	if m.refusals.lastSecond(now) < 2 {
		gap = loneSlotsGap
	}
	if tracked || now.Sub(c.heldAt) < gap {
		m.letGoNow(now)
		return
	}
	c.held = false
	m.move(toOverload, now)
	ev.add(change{kind: evTryLimit, n: int(c.limit)})
}

// busy is what counts against a limit in flight: the attempts with a
// ticket, and while the limit is a fresh record's hold, those sent before
// the record still on their way.
func (m *hostModel) busy() int32 {
	if m.ctl.untold {
		return m.inflight + int32(m.ghosts)
	}
	return m.inflight
}

// letGo ends a fresh record's hold for an answer once the record is a
// hold old.
func (m *hostModel) letGo(now instant) {
	if m.ctl.held && !m.fresh(now) {
		m.letGoNow(now)
	}
}

// letGoNow ends a fresh record's hold for an answer.
func (m *hostModel) letGoNow(now instant) {
	c := &m.ctl
	c.limit, c.held, c.untold = 0, false, false
	if c.rate == 0 {
		c.ceil = 0
	}
	m.wake(now) // those waiting for an answer ask again
}
