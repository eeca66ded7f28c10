package retryhttp

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// quota is what a host announces it grants: limit per window, remaining
// until reset. A host whose reset moment moves between answers refills as
// it goes (a sliding window, a token bucket): it is held to what remains
// and refilled at limit per window; any other is held to what remains
// until its reset, then grants limit again.
//
// A reset does not say which kind the window is: a fixed one is whole
// again, a sliding count still counts most of the window before (and
// refuses a burst at its reset, often with a Retry-After of a whole
// window). Until the first answer after a reset tells, the window grants
// one attempt a slack after the reset, then its average rate (probing): a
// fixed one costs a round trip, once, and a sliding one is never sent the
// burst it refuses.
type quota struct {
	window    time.Duration // said (RateLimit-Policy's w), or the longest reset seen
	at        instant       // when the last answer came
	resetAt   instant       // when it is whole again; zero: not said
	named     instant       // the moment the last refusal named as its wait
	saidReset instant       // the reset the last answer said; zero: none
	saidAt    instant       // and when it came
	limit     int32
	remaining int32 // what the last answer said, less what was in flight then
	taken     int32 // attempts sent since that answer
	since     int32 // attempts sent since the last reset
	said      int32 // the remaining the last answer said, as said
	rolled    bool  // a reset passed since the announcement: since counts from it
	sliding   bool
	fixed     bool // whole again after a reset: it grants its limit at once
	probing   bool // a reset passed, and no answer since told its kind
	counts    bool // it slides, with a reset that stays put: a count of the window before, not a bucket
	restarts  bool // seen whole again within half a window of spent: a window that starts anew
	tight     bool // it refused a pace at its rate: it counts whole requests (a log), not a bucket's refill
	renewed   bool // it replaced another announcement: the old pace's schedule goes
	// When the quota is first announced, or its window first seen to
	// slide, what it said remains: the pace's burst is charged with what
	// the host still counts, once.
	syncLeft int32
	syncAt   instant
	// The fewest said to remain since lowFrom, and whether no answer of
	// the last whole window said less than half the limit remains
	// (spare): a host that stays more than half full under a pace that
	// binds gives back faster than it is asked, more than its
	// announcement says (throttled announces a bucket's burst as its
	// limit, and the time to fill it as its reset). A window or count
	// paced at its rate runs down to its last few.
	lowFrom instant
	low     int32
	spare   bool
	beyond  bool // spare was seen under a pace that bound: the announced rate is a floor, not a cap
	deep    bool // an answer said more remain than the limit
	whole   bool // a fixed window over a hold whole again: its quota goes at once, whatever parked the host before
	// shown is the window the host's own count shows, when no header
	// names one (see countWindow); zero: none shown.
	shown   int32   // in seconds
	lowRate float32 // the pace when the window low counts over began
}

// watchSpare takes in what an answer says remains, and returns the fewest
// said over the window that ended with it; -1 when none ended.
func (q *quota) watchSpare(left int32, now instant) (low int32) {
	low = -1
	if q.lowFrom.IsZero() {
		q.low, q.lowFrom = left, now
		return low
	}
	q.low = min(q.low, left)
	// More left than the limit after a request: the limit is the rate of
	// a deeper bucket (tollbooth says its rate, and its tokens left), and
	// the rate it says is the rate.
	q.deep = q.deep || left >= q.limit
	if now.Sub(q.lowFrom) >= max(q.window, holdTime) {
		q.spare = !q.deep && q.low >= 1 && 2*q.low >= q.limit
		low = q.low
		q.low, q.lowFrom = left, now
	}
	return low
}

// countWindow is the window a host's count shows under a pace at rate
// that bound for a whole window, when no header names it: a window is
// inferred from the longest reset seen, said in whole seconds, and comes
// out up to a second long (a 1 s window read as 2 s halves the pace). A
// window that slides as it goes (a log; its reset moves) over W, held
// all that window at rate, holds rate·W attempts at every instant, so
// the fewest said to remain over a window (low) shows W as
// (limit-low)/rate, to the nearest second. Zero when it shows nothing: a
// window that ran out (a fixed window spent at its end does that at any
// pace) or a pace that did not bind. The window is lowered by the second
// its rounding may add, no more: a pace that bound for only part of the
// window sent less than its rate, and shows a window too short.
func (q *quota) countWindow(low int32, rate float64) time.Duration {
	if low < 2 || q.deep || rate <= 0 || math.IsInf(rate, 1) {
		return 0
	}
	w := time.Duration(float64(q.limit-low) / rate * float64(time.Second)).Round(time.Second)
	return max(w, time.Second)
}

func (q *quota) active() bool { return q != nil && q.limit > 0 }

// perSecond is the rate the quota allows, 0 when its window is unknown.
func (q *quota) perSecond() float64 {
	if q.window <= 0 {
		return 0
	}
	return float64(q.limit) / q.window.Seconds()
}

// paceRate is the rate a host is paced at by its quota: perSecond, but
// one fewer a window for a sliding count (a window that slides while its
// reset stays put: the last window's count weighted, plus this one's) of
// more than resetSlack. Such a count rounds, and refuses at its limit
// whenever the pace's phase falls early in its window, for the rest of
// the window or the whole of it (httprate names its window as the
// Retry-After): one attempt in limit is the price of never losing more
// than a second. A token bucket (its reset moves) takes its rate.
//
// A window seen to start anew (restarts) is stretched by paceMargin: a
// pace of exactly limit a window sends the attempt after a window's limit
// at the very instant the window ends, where a window that starts at its
// first request (ulule's, most INCR-and-EXPIRE counters) still counts
// it. Refused there, its request goes to the back of the queue and can
// meet the next such instant: two tries lost to the phase of a pace. A
// sliding count is not stretched: at exactly its rate it holds the same
// count at every attempt, and a pace a hair slower drifts into the
// instants after its windows start, where it refuses.
func (q *quota) paceRate() float64 {
	if !q.active() {
		return 0
	}
	switch {
	case q.restarts:
		return float64(q.limit) / (q.window + q.window/paceMargin).Seconds()
	case q.counts && q.window > resetSlack && q.limit > 1:
		return float64(q.limit-1) / q.window.Seconds()
	case q.tight:
		return float64(q.limit) / (q.window + min(q.window/time.Duration(2*q.limit), tightStretchMax)).Seconds()
	}
	return q.perSecond()
}

// A log (every request of the last window counted) paced at exactly its
// rate meets, at each attempt, the one sent a window before, still counted
// when the two are a hair closer than a window apart: it refuses, names
// the moment that one leaves, and the host is parked until then, a
// second or more each time. A token bucket, refilling as it goes, never
// refuses a pace at its rate. So a window (neither a count of the window
// before nor one that starts anew, which have their own margins) that
// refuses a pace at its rate is tight: its pace is stretched by half an interval a
// window, which keeps attempts a window apart through that much jitter
// (as phaseRefusal shifts a count's), for a share 1/(2·limit) of the rate.
// The stretch is at most tightStretchMax a window.

// tightStretchMax bounds a tight window's stretch: jitter is well under a
// second, and half an interval of a quota of one a minute is 30 s, which
// would hold each request half a minute past the window and past the
// Retry-After bound a learned wait keeps to (the fuzzer found a limit of 1
// over 50 s paced at one attempt every 75 s).
const tightStretchMax = time.Second

// spareGrowth is how much a pace grows each hold past an announced rate
// while the host says it has more (quota.spare).
const spareGrowth = 1.25

// paceMargin stretches a restarting window for its pace by one part in
// paceMargin: 10 ms a second, more than a loopback's or a LAN's jitter,
// for 1% of the rate.
const paceMargin = 100

// tokens is how many attempts the quota lets go at now.
func (q *quota) tokens(now instant) float64 {
	if !q.resetAt.IsZero() && !now.Before(q.resetAt) {
		q.roll(now)
	}
	t := float64(q.remaining)
	switch {
	case q.sliding:
		t = min(float64(q.limit), t+now.Sub(q.at).Seconds()*q.perSecond())
	case q.probing:
		// One at the reset, then the average rate.
		t = 0
		if since := now.Sub(q.at.Add(q.slack())); since >= 0 {
			t = min(float64(q.remaining), 1+math.Floor(since.Seconds()*q.perSecond()+tokenSlack))
		}
	}
	return t - float64(q.taken)
}

// roll starts the window after the reset: whole again.
func (q *quota) roll(now instant) {
	if !q.probing {
		q.at = q.resetAt // a window still untold keeps its grants from the first reset
	}
	q.remaining, q.taken, q.since, q.rolled = q.limit, 0, 0, true
	q.probing = !q.fixed && !q.sliding && q.limit > 1 && q.perSecond() > 0
	q.whole = q.fixed && q.window > holdTime
	switch {
	case q.window <= 0:
		q.resetAt = 0
	default:
		// The resets to come, a window apart, the first after now.
		n := now.Sub(q.resetAt)/q.window + 1
		q.resetAt = q.resetAt.Add(n * q.window)
	}
}

// resetSlack is how late a reset may come after the moment said: headers
// say it in whole seconds, and a Unix time is truncated to one.
const resetSlack = time.Second

// slack is how long after the reset said the first grant of a window of
// unknown kind waits: none when a refusal named that very moment as its
// wait (a spent quota's reset), as the host asked to be asked then;
// resetSlack for a window longer than that, whose reset, said in whole
// seconds, may come up to a second late, and where an attempt a moment
// early can be refused for the whole window (httprate names its window as
// every refusal's Retry-After: a burst refused as a window opens is told
// to come back as the next opens, where the count still refuses it); an
// interval for a shorter one, as a sliding count refuses at its reset
// what it counted of the window before. A Retry-After that ends later
// holds the host (it is parked) until then anyway.
func (q *quota) slack() time.Duration {
	switch {
	case !q.named.IsZero() && absDuration(q.named.Sub(q.at)) < time.Millisecond:
		return 0
	case q.window > resetSlack:
		return resetSlack
	}
	return time.Duration(float64(time.Second) / q.perSecond())
}

// tokenSlack absorbs the rounding of a quota's refill, so that a token all
// but whole is whole.
const tokenSlack = 1e-9

// nextToken is when the quota next lets an attempt go, when it lets none
// go at now; zero when nothing is known to refill it.
func (q *quota) nextToken(now instant) instant {
	missing := 1 - q.tokens(now) - tokenSlack
	if q.sliding && q.perSecond() > 0 {
		wait := time.Duration(math.Ceil(missing / q.perSecond() * float64(time.Second)))
		at := now.Add(max(wait, time.Microsecond))
		if !q.resetAt.IsZero() && at.After(q.resetAt) {
			return q.resetAt
		}
		return at
	}
	if q.probing && q.taken < q.remaining {
		// The next grant at the average rate from the reset, unless the
		// window's kind is told before it. (With all that remains taken,
		// probing grants no more: the next is at the reset; before, a
		// window that restarts asked to be asked again a microsecond
		// later, all the way to it: the fuzzer's 4b67ca2686d29ac8.)
		wait := time.Duration(float64(q.taken) / q.perSecond() * float64(time.Second))
		if at := q.at.Add(q.slack() + wait); at.After(now) {
			return at
		}
		return now.Add(time.Microsecond)
	}
	return q.resetAt
}

// quotaWait says whether the quota lets no attempt go at now, and until
// when. While the record is fresh, the attempts of the burst that made it,
// still on their way, are counted against what remains (up to a quota's
// worth, and no longer than the record is fresh: a busy process's other
// traffic is not this host's).
func (m *hostModel) quotaWait(now instant) (instant, bool) {
	if m.q.sliding && m.q.perSecond() > 0 {
		// A window that slides gives back as it goes, at the rate it
		// announces: the pace keeps to it (what it says remains lags a
		// sliding count, and hovers at none for a client at its rate).
		return 0, false
	}
	tokens := m.q.tokens(now) + tokenSlack
	if tokens < 1 {
		// Spent, until the moment it names; a host that names none is
		// asked, and says so again.
		at := m.q.nextToken(now)
		return at, !at.IsZero()
	}
	if m.fresh(now) && tokens-min(float64(m.ghosts), float64(m.q.limit)) < 1 {
		return m.since.Add(holdTime), true
	}
	return 0, false
}

// learnQuota tells the host's quota of an answer that announces one, and
// holds the learned rate to the quota's when the quota finds its window
// tight.
func (m *hostModel) learnQuota(s *sample) {
	if m.q == nil {
		m.q = new(quota)
	}
	m.q.observe(s)
	if s.capRate > 0 && m.ctl.rate > s.capRate {
		m.setRate(s.ev, s.capRate, s.at)
	}
}

// paceLimit is the pace a host whose learned rate is learned (0: none) and
// whose quota is q is held to, as hostModel.pace says it: +Inf for none.
func paceLimit(learned float64, q *quota) float64 {
	switch {
	case learned > 0:
		return float64(newPace(rate.Limit(learned), 1).Limit)
	case q.paceRate() > 0:
		return float64(newPace(rate.Limit(q.paceRate()), 1).Limit)
	}
	return math.Inf(1)
}

// observe takes in what an answer announces.
func (q *quota) observe(s *sample) {
	sig, now, learned := s.sig, s.at, s.rate
	limit, left := clamp32(sig.Limit), clamp32(sig.Remaining)
	window := sig.Window
	if window <= 0 {
		// Not said: the longest reset seen (an answer at its reset says
		// nothing of the window).
		if limit == q.limit {
			window = q.window
		}
		if sig.Reset > 0 {
			window = max(window, sig.Reset.Round(time.Second), time.Second)
		}
		if q.shown > 0 && limit == q.limit {
			window = min(window, time.Duration(q.shown)*time.Second)
		}
	}
	if q.limit != limit || (sig.Window > 0 && q.window != sig.Window) {
		// A new announcement replaces the old, and so does the pace's
		// schedule of the old: slots a pace of 5000 an hour handed out
		// mean nothing to one of 30 a minute (syncQuota).
		renewed := q.active()
		*q = quota{renewed: renewed}
		s.ev.add(change{kind: evQuota, n: int(limit), window: window})
		if left >= 0 {
			// What was sent before the host said its quota is spent from
			// the pace's burst too, once: a burst sent before any answer
			// was not paced.
			q.syncAt, q.syncLeft = now, max(left-s.inflight, 0)
		}
	}
	q.limit, q.window = limit, window
	if sig.Refused && sig.Wait > 0 {
		q.named = now.Add(sig.Wait)
	}
	if sig.Refused && !q.counts && !q.restarts && !q.tight && !s.fresh {
		if p := paceLimit(learned, q); p >= cutShare*q.perSecond() && p <= q.perSecond()/cutShare {
			q.tight = true
			if learned > q.paceRate() {
				s.capRate, learned = q.paceRate(), q.paceRate()
			}
		}
	}
	if !q.resetAt.IsZero() && !now.Before(q.resetAt) {
		q.roll(now) // the answer is of the window after the reset
	}
	// A window that slides (a sliding count, a token bucket) gives back as
	// it goes; a fixed one only at its reset. The host shows which: a fixed
	// window names the same moment until it ends (in whole seconds, as the
	// headers say it), and is whole again after it.
	if sig.Reset >= 0 {
		resetAt := now.Add(sig.Reset)
		switch {
		case q.resetAt.IsZero() || !now.Before(q.resetAt):
			q.resetAt = resetAt
		case q.probing && q.window > 2*resetSlack && absDuration(resetAt.Sub(now.Add(-sig.Latency).Add(q.window))) <= resetSlack:
			// The first answer after a reset names a reset a window after
			// its own send: the window starts at the first request after
			// the last one ended (ulule's, most INCR-and-EXPIRE
			// counters), not on a schedule of its own. It moved because
			// nothing was sent at the reset, not because it slides.
			q.restarts, q.resetAt = true, resetAt
		case absDuration(resetAt.Sub(q.resetAt)) > time.Second:
			q.sliding, q.counts = true, false // the moment moved within the window: a bucket
			q.resetAt = resetAt
		case resetAt.Before(q.resetAt) && sig.Reset > 0:
			// Said in whole seconds, counted from a Date in whole
			// seconds, the moment comes late by up to a second: the
			// earliest said is the nearest. A reset of 0 s says only
			// that it falls within the second, not that it is now.
			q.resetAt = resetAt
		}
	}
	if left >= 0 && q.rolled {
		// Not whole after its reset: it counts the window before.
		if !q.sliding && left < q.limit-q.since {
			q.sliding, q.counts = true, true
			q.syncAt, q.syncLeft = now, max(left-s.inflight, 0)
		}
		if q.probing && !q.sliding && q.window > holdTime {
			q.whole = true // told fixed: the rest of the window goes at once
		}
		q.fixed = !q.sliding
		q.probing = false
	}
	if left >= 0 {
		if low := q.watchSpare(left, now); low >= 0 {
			r := float32(paceLimit(learned, q))
			if sig.Window <= 0 && q.sliding && !q.counts && r == q.lowRate && s.bound {
				if w := q.countWindow(low, float64(r)); w > 0 && w < q.window && w >= q.window-time.Second {
					q.shown, q.window = int32(w/time.Second), w
				}
			}
			q.lowRate = r
		}
		q.restarted(left, sig.Reset, now)
		// What was in flight when the host counted is taken from it too.
		q.remaining, q.taken, q.at = left-s.inflight, 0, now
	}
}

// restarted marks a window seen to start anew: spent, then whole within
// half a window, with a reset a window later. Neither a bucket nor a
// sliding count gives back more than its rate in the time between, and
// answers out of order are of one window (the same reset) or say an
// earlier reset after a later one.
func (q *quota) restarted(left int32, reset time.Duration, now instant) {
	var resetAt instant
	if reset >= 0 {
		resetAt = now.Add(reset)
	}
	if q.said <= 1 && left >= q.limit-1 && q.limit > 2 && now.Sub(q.saidAt) < q.window/2 &&
		!q.saidReset.IsZero() && !resetAt.IsZero() && resetAt.Sub(q.saidReset) >= q.window/2 {
		q.restarts = true
	}
	q.said, q.saidReset, q.saidAt = left, resetAt, now
}

// tookQuota counts an attempt against the host's announced quota.
func (m *hostModel) tookQuota() {
	if m.q.active() {
		m.q.taken++
		if m.q.rolled {
			m.q.since++
		}
	}
}

// syncQuota charges the pace's burst, once, with what a window just seen
// to slide still counts: a client that waited for a reset has its whole
// burst in hand, which the window would refuse. Only when the quota is
// what paces the host.
func (m *hostModel) syncQuota(st *hostState, pace Pace, now time.Time) {
	q := m.q
	if q == nil {
		return
	}
	if q.renewed {
		// The slots handed out were of the announcement replaced: the
		// new one is charged below with what it says remains, no more.
		q.renewed = false
		if at := m.at(now); st.tat.After(at) {
			st.tat = at
		}
	}
	if q.whole {
		// A fixed window whole again grants its limit at once (what
		// remains is held by quotaWait): neither the pace's schedule of
		// the window before nor the parking that waited for its reset
		// holds its burst back.
		q.whole = false
		at := m.at(now)
		if !st.until.After(at) {
			st.until = 0
		}
		if st.tat.After(at) {
			st.tat = at
		}
	}
	if q.syncAt.IsZero() {
		return
	}
	if m.ctl.rate == 0 && pace == m.pace() {
		floor := q.syncAt.Add(time.Duration(max(pace.Burst-int(q.syncLeft), 0)) * pace.interval())
		if !q.resetAt.IsZero() {
			// Whatever remains, the window is whole at its reset: no
			// charge holds a slot past it.
			if whole := q.resetAt.Add(time.Duration(pace.Burst-1) * pace.interval()); floor.After(whole) {
				floor = whole
			}
		}
		if st.tat.Before(floor) {
			st.tat = floor
		}
	}
	q.syncAt = 0
}

// clamp32 is a count an answer said, within an int32: a number past two
// billion in a header is absurd, and read as the most an int32 holds.
func clamp32(n int) int32 { return int32(max(min(n, math.MaxInt32), math.MinInt32)) }
