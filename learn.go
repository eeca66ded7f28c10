package retryhttp

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// Learning each host's capacity (R13). The Transport reads what each answer
// says of its host (observe) and tells the Limiter (Learn); the in-process
// Limiter keeps, per host that ever refused or announced a quota, a
// capacity: the pace it learned, and what it counted to learn it.
//
//   - A host that announces its quota (X-RateLimit-Limit with a reset,
//     RateLimit-Policy) is paced at the announced rate, quota over window,
//     with a bucket of the quota that never holds more than the host says
//     remains, less what was sent to it and not answered yet.
//   - A refusal (a 429, or a 503 that names no wait) that is not noise (a
//     429 always; a 503 when refusals are at least a tenth of what the host
//     got in the last second, and more than one unless the pace is probing
//     past what the host took before) cuts the pace to 0.9 of what the host
//     accepted in that second, once a second; refusals of the same burst
//     arriving after the cut lower it further to what they show was
//     accepted, and the pace starts when the burst's second is over.
//   - While requests queue for the pace and nothing is refused, the pace
//     grows each second, by 10 %, then 30 %, 90 %, then doubling, but stays
//     2 s at 0.95 of what the host accepted when it last refused before
//     probing past it, from 5 %. A pace that holds nothing back, on a host
//     that refused nothing for learnWatch, is dropped.
//   - A host not heard of for learnTTL is forgotten.

const (
	learnBeta      = 0.9                    // a cut keeps this share of what was accepted
	learnHold      = time.Second            // no second cut, and no growth, this soon after a cut
	learnGrowEvery = time.Second            // the pace grows at most this often
	learnStep      = 0.1                    // the first growth step after a cut; each next one is three times it, up to 1
	learnNear      = 0.95                   // growth slows down at this share of the rate refused
	learnNoise     = 0.1                    // a 503 is overload when refusals are this share of what was sent
	learnMinRate   = 0.5                    // the slowest pace a cut sets without a hint, attempts a second
	learnMaxRate   = 1_000_000              // an announced rate above this is absurd, and ignored
	learnTTL       = 60 * time.Second       // a host quiet this long forgets what was learned
	learnWatch     = 10 * time.Second       // an unpaced host that refused nothing this long is forgotten
	learnIdle      = 3 * time.Second        // a sweep forgets a host quiet this long
	learnHorizon   = 250 * time.Millisecond // a learned pace hands out slots no further ahead
	learnPlateau   = 2 * time.Second        // the pace stays just below the rate refused this long
	learnMaxWindow = 24 * time.Hour         // an announced window longer than this is ignored
	learnMaxAhead  = 10 * time.Second       // an empty bucket holds the next slot back this long at most
)

// capacity is what the in-process limiter learned of one host.
type capacity struct {
	rate        float64       // the learned pace, attempts a second; 0: not paced
	announced   float64       // the rate the host announces; 0: none
	quota       int           // the quota it announces: the bucket's size
	window      time.Duration // the longest reset it named: the window, when it names none
	refusedAt   float64       // what the host accepted when it last refused more; 0: never refused
	step        float64       // the next growth step
	refusals    bool          // refused at least once: no burst since
	holdUntil   time.Time
	nearAt      time.Time // when the pace reached just below refusedAt
	burstCut    bool      // the last cut was of an unpaced host's burst
	grownAt     time.Time
	busyAt      time.Time // a request last waited for the learned pace
	pending     float64   // sent and not answered yet, as far as answers tell
	seen        time.Time
	lastRefusal time.Time
	sent        sliding
	refused     sliding
}

// expired reports whether what was learned can be forgotten: the host has
// been quiet for learnTTL, or is not paced and has refused nothing for
// learnWatch (its refusals were noise).
func (c *capacity) expired(now time.Time) bool {
	return now.Sub(c.seen) >= learnTTL || (c.rate == 0 && now.Sub(c.lastRefusal) >= learnWatch)
}

// pace is the learned pace, unlimited when none.
func (c *capacity) pace() Pace {
	if c.rate <= 0 {
		return Pace{Limit: rate.Inf}
	}
	burst := 1
	if !c.refusals && c.quota > 1 {
		burst = c.quota
	}
	return newPace(rate.Limit(c.rate), burst)
}

// ceiling is the fastest the pace may grow: the announced rate, and below
// the rate last refused when the host announced one.
func (c *capacity) ceiling() float64 {
	if c.announced == 0 {
		return math.Inf(1)
	}
	if c.refusedAt > 0 {
		return min(c.announced, learnNear*c.refusedAt)
	}
	return c.announced
}

// paceOf is the pace for an attempt to a host: the configured one, or the
// learned one when slower. It grows the learned pace when it is time, and
// forgets an expired one.
func (l *localLimiter) paceOf(host string, st *hostState, configured Pace, now time.Time) Pace {
	c := st.cap
	if c == nil {
		return configured
	}
	if c.expired(now) {
		l.setRate(host, st, 0, now)
		st.cap = nil
		l.learning.Add(-1)
		return configured
	}
	c.seen = now
	if c.rate > 0 && !now.Before(c.holdUntil) && now.Sub(c.grownAt) >= learnGrowEvery {
		// Grow only a pace that holds requests back: one that sends all
		// that comes has shown nothing more of the host.
		switch sent := c.sent.lastSecond(now); {
		case now.Sub(c.busyAt) < learnGrowEvery:
			l.grow(host, st, now)
		case c.announced == 0 && sent < c.rate/2 && now.Sub(c.lastRefusal) >= learnWatch:
			// Demand is far below a pace the host has not refused for
			// a while: the pace holds nothing back, and is dropped.
			l.setRate(host, st, 0, now)
		}
		c.grownAt = now
	}
	return configured.min(c.pace())
}

// grow raises a learned pace that demand keeps up with: up to just below
// the rate the host accepted when it last refused, a while there, then
// faster and faster past it, in case the host can take more now.
func (l *localLimiter) grow(host string, st *hostState, now time.Time) {
	c := st.cap
	next := c.rate * (1 + c.step)
	near := learnNear * c.refusedAt
	switch {
	case c.rate < near && next >= near:
		// Just below the rate refused: stay a while before probing past it.
		next, c.step, c.nearAt = near, learnStep/2, now
	case !c.nearAt.IsZero() && now.Sub(c.nearAt) < learnPlateau:
		return
	default:
		c.step = min(3*c.step, 1)
	}
	l.setRate(host, st, min(next, c.ceiling()), now)
}

func (l *localLimiter) Learn(_ context.Context, host string, sig Signal) (Pace, error) {
	now := sig.Now
	s := &l.shards[shardOf(host)]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.hosts[host]
	if sig.Limit <= 0 && !sig.Refused {
		if st == nil || st.cap == nil {
			return Pace{Limit: rate.Inf}, nil
		}
		return st.cap.pace(), nil
	}
	if st == nil {
		st = s.add(l, host, now)
	}
	fresh := st.cap == nil
	if fresh {
		st.cap = &capacity{step: learnStep}
		l.learning.Add(1)
	}
	c := st.cap
	c.seen = now
	// One answer in: one fewer in flight. A new host had in flight at most
	// what the process sent lately, this answer's request among them.
	if fresh {
		// What this host got before it was counted: at most what the
		// process sent to every host.
		c.sent.add(now, sig.Sent)
		c.pending = max(sig.Sent-1, 0)
	} else {
		c.pending = max(c.pending-1, 0)
	}
	if sig.Limit > 0 {
		l.learnQuota(host, st, sig)
	}
	if sig.Refused {
		c.refused.add(now, 1)
		c.lastRefusal = now
		l.learnRefusal(host, st, sig)
	}
	return c.pace(), nil
}

// learnQuota paces a host at the rate it announces, and holds its bucket to
// what it says remains.
func (l *localLimiter) learnQuota(host string, st *hostState, sig Signal) {
	c := st.cap
	window := sig.Window
	if window <= 0 && sig.Reset > 0 {
		c.window = max(c.window, sig.Reset.Round(time.Second), time.Second)
		window = c.window
	}
	if window <= 0 || window > learnMaxWindow {
		return
	}
	r := float64(sig.Limit) / window.Seconds()
	if r > learnMaxRate {
		return
	}
	// A quota of a few a day is not paced a request an hour: pacing stays
	// at learnMinRate at least, and the host's refusals, parking it until
	// its reset within the Retry-After bounds, keep to the rest.
	r = max(r, learnMinRate)
	c.announced, c.quota = r, sig.Limit
	if c.rate == 0 || c.rate > c.ceiling() {
		l.setRate(host, st, c.ceiling(), sig.Now)
	}
	if sig.Remaining >= 0 && c.rate > 0 {
		// The bucket holds what remains at most: what the host says, less
		// what was sent to it and not answered yet (it was sent within the
		// last second). Short of that, the next slot waits a slot for each
		// one missing, but not past the reset.
		p := c.pace()
		interval, tolerance := p.interval(), time.Duration(p.Burst-1)*p.interval()
		avail := sig.Remaining - int(math.Ceil(min(c.pending, c.sent.lastSecond(sig.Now))))
		// Bounded by the reset, and by learnMaxAhead whatever the host
		// says: a spent quota that lasts is the host's to say with a
		// refusal, which parks it within the Retry-After bounds.
		ahead := time.Duration(p.Burst-min(avail, p.Burst)) * interval
		if sig.Reset > 0 {
			ahead = min(ahead, sig.Reset+tolerance)
		}
		ahead = min(ahead, learnMaxAhead+tolerance)
		if floor := sig.Now.Add(ahead); st.tat.Before(floor) {
			st.tat = floor
		}
	}
}

// learnRefusal cuts the pace of a host that refused, unless the refusal is
// noise.
func (l *localLimiter) learnRefusal(host string, st *hostState, sig Signal) {
	c, now := st.cap, sig.Now
	// What the process sent to every host bounds what this host got,
	// including a burst sent before the host was counted.
	sent, refused := max(c.sent.lastSecond(now), sig.Sent), c.refused.lastSecond(now)
	// A 503 is overload when refusals are a tenth of what was sent, and
	// not a lone one, unless the pace is probing past what the host took
	// when it last refused: that is where a lone refusal is expected.
	probing := c.rate > 0 && c.rate > learnNear*c.refusedAt
	overload := sig.Wait > 0 || sig.Status == http.StatusTooManyRequests ||
		((refused >= 2 || probing) && refused >= learnNoise*sent)
	if !overload {
		return
	}
	// What the host accepted in the last second is what it can take, at
	// most; a Retry-After of w seconds on a 429 says at least 1/w.
	accepted := max(sent-refused, 0)
	if sig.Wait > 0 {
		accepted = max(accepted, 1/sig.Wait.Seconds())
	}
	accepted = max(accepted, learnMinRate)
	target := min(learnBeta*accepted, c.ceiling())
	if now.Before(c.holdUntil) {
		// The refusals of the burst that made the first cut, arriving
		// after it, say more of what was accepted. After a cut of a paced
		// host they are its own late refusals, and say nothing new.
		if c.burstCut && target < c.rate {
			c.refusedAt = min(c.refusedAt, accepted)
			l.setRate(host, st, target, now)
		}
		return
	}
	// The rate to stay under: what the host accepted; for a host that
	// announces its quota and refused the pace it was held to, that pace
	// (the announcement already says what it accepts).
	c.burstCut, c.refusedAt, c.refusals = c.rate == 0, accepted, true
	if c.rate > 0 {
		target = min(target, learnBeta*c.rate)
		if c.announced > 0 {
			c.refusedAt = c.rate
		}
	}
	c.step, c.holdUntil, c.grownAt, c.nearAt = learnStep, now.Add(learnHold), now, time.Time{}
	if c.burstCut && st.tat.Before(now.Add(learnHold)) {
		// What the host accepted of the burst it took from the second
		// that is still running: the pace starts when that second ends.
		st.tat = now.Add(learnHold)
	}
	l.setRate(host, st, max(target, min(learnMinRate, c.ceiling())), now)
}

// setRate changes a host's learned pace, and logs a change that matters: a host paced or unpaced, or a pace halved or doubled since.
func (l *localLimiter) setRate(host string, st *hostState, r float64, now time.Time) {
	c := st.cap
	old := c.rate
	c.rate = r
	if l.logger == nil || (old > 0 && r > 0 && r < 2*old && r > old/2) || old == r {
		return
	}
	l.logger.LogAttrs(context.Background(), slog.LevelInfo, "retryhttp: learned pace",
		slog.String("host", host), slog.Float64("from", round2(old)), slog.Float64("to", round2(r)))
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// sliding counts events over the last second in two one-second bins: the
// current one whole, and the share of the last that the second still
// covers.
type sliding struct {
	start     time.Time // the current bin's start
	cur, prev float64
}

func (s *sliding) roll(now time.Time) {
	switch d := now.Sub(s.start); {
	case d < time.Second:
	case d < 2*time.Second:
		s.start, s.prev, s.cur = s.start.Add(time.Second), s.cur, 0
	default:
		s.start, s.prev, s.cur = now, 0, 0
	}
}

func (s *sliding) add(now time.Time, n float64) {
	s.roll(now)
	s.cur += n
}

func (s *sliding) lastSecond(now time.Time) float64 {
	s.roll(now)
	return s.cur + s.prev*(1-float64(now.Sub(s.start))/float64(time.Second))
}

// observe reads what an answer says of its host, parks the host when it
// named a wait and tells the limiter what it says of the host's capacity,
// and fills in a for decide. It reports false for a plain success: nothing
// to observe and nothing to decide, at the cost of three header lookups,
// no clock reading, no parsing and no call to the limiter.
func (c *call) observe(a *answer) bool {
	t, resp := c.t, a.resp
	if resp == nil {
		a.now = t.clock.Now()
		return true
	}
	h, code := resp.Header, resp.StatusCode
	// Three lookups: a host that announces a quota says what remains of
	// it too (X-RateLimit-Limit comes with -Remaining, RateLimit-Policy
	// with RateLimit or RateLimit-Remaining).
	quota := len(h["X-Ratelimit-Remaining"]) > 0 || len(h["Ratelimit-Remaining"]) > 0 || len(h["Ratelimit"]) > 0
	if code < 400 && !quota && c.retryIf == nil && !t.statuses.has(code) {
		return false
	}
	now := t.clock.Now()
	a.now = now
	var q announcement
	if quota && !t.noLearning {
		q = announced(h, now)
	}
	a.wait, a.named = serverWait(resp, now, q.limit > 0)
	if a.named && a.wait > 0 {
		until := t.park(c.ctx, c.hostName(), now, max(a.wait, t.raFloor))
		if len(t.onPark) > 0 {
			ev := ParkEvent{Request: c.req, Host: c.hostName(), Until: until, Status: resp.StatusCode}
			for _, hook := range t.onPark {
				hook(ev)
			}
		}
	}
	refused := code == http.StatusTooManyRequests || (code == http.StatusServiceUnavailable && !a.named)
	if t.noLearning || (!refused && q.limit == 0) {
		return true
	}
	sig := Signal{Now: now, Refused: refused, Status: code, Limit: q.limit, Window: q.window,
		Reset: q.reset, Remaining: q.remaining, Sent: t.sentLastSecond(now)}
	if code == http.StatusTooManyRequests && a.named {
		sig.Wait = max(a.wait, t.raFloor)
	}
	if _, lerr := t.limiter.Learn(c.ctx, c.hostName(), sig); lerr != nil && t.logger != nil {
		t.logger.LogAttrs(c.ctx, slog.LevelWarn, "retryhttp: learning failed",
			slog.String("host", c.hostName()), slog.String("error", lerr.Error()))
	}
	return true
}

// serverWait is the wait a response names: Retry-After on an error status,
// else the reset of a spent quota. A spent quota on a success is the last
// request the host allows until the reset; when the host also says its
// rate (paced says learning paces it), the next ones are spread over the
// window instead, and the response names no wait: parking the host until
// the reset would halve what a sliding window allows.
func serverWait(resp *http.Response, now time.Time, paced bool) (time.Duration, bool) {
	h := resp.Header
	if resp.StatusCode >= 400 {
		if w, ok := retryAfter(h, now); ok {
			return w, true
		}
	}
	w, ok := quotaReset(h, now)
	if ok && resp.StatusCode < 400 && paced {
		return 0, false
	}
	return w, ok
}
