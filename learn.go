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
//     remains.
//   - A refusal (a 429, or a 503 that names no wait) that is not noise (a
//     429 always; a 503 when refusals are at least a tenth of what the host
//     got in the last second) cuts the pace to 0.9 of what the host accepted
//     in that second, once a second; refusals of the same burst arriving
//     after the cut lower it further to what they show was accepted.
//   - While demand keeps up with the pace and nothing is refused, the pace
//     grows each second, by 10 %, then 20 %, 40 %... up to doubling, but
//     only to 0.95 of the rate last refused before probing past it slowly.
//     A pace that doubles the rate last refused, on a host that announces
//     nothing, is dropped: the host is unpaced again.
//   - A host not heard of for learnTTL is forgotten.

const (
	learnBeta      = 0.9              // a cut keeps this share of what was accepted
	learnHold      = time.Second      // no second cut, and no growth, this soon after a cut
	learnGrowEvery = time.Second      // the pace grows at most this often
	learnStep      = 0.1              // the first growth step after a cut
	learnNear      = 0.95             // growth slows down at this share of the rate refused
	learnNoise     = 0.1              // a 503 is overload when refusals are this share of what was sent
	learnMinRate   = 0.5              // the slowest pace a cut sets without a hint, attempts a second
	learnMaxRate   = 1_000_000        // an announced rate above this is absurd, and ignored
	learnTTL       = 60 * time.Second // a host quiet this long forgets what was learned
	learnWatch     = 10 * time.Second // an unpaced host that refused nothing this long is forgotten
	learnIdle      = 3 * time.Second  // a sweep forgets a host quiet this long
	learnHorizon   = time.Second      // a learned pace hands out slots no further ahead
	learnMaxWindow = 24 * time.Hour   // an announced window longer than this is ignored
)

// capacity is what the in-process limiter learned of one host.
type capacity struct {
	rate        float64       // the learned pace, attempts a second; 0: not paced
	announced   float64       // the rate the host announces; 0: none
	quota       int           // the quota it announces: the bucket's size
	window      time.Duration // the longest reset it named: the window, when it names none
	refusedAt   float64       // the rate last refused; 0: never refused
	step        float64       // the next growth step
	refusals    bool          // refused at least once: no burst since
	holdUntil   time.Time
	grownAt     time.Time
	busyAt      time.Time // an attempt waited for the learned pace
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
		if now.Sub(c.busyAt) < learnGrowEvery {
			l.grow(host, st, now)
		}
		c.grownAt = now
	}
	return configured.min(c.pace())
}

// grow raises a learned pace that demand keeps up with: fast, then slowly
// near the rate last refused; past twice that, on a host that announces
// nothing, the pace is dropped.
func (l *localLimiter) grow(host string, st *hostState, now time.Time) {
	c := st.cap
	next := c.rate * (1 + c.step)
	near := learnNear * c.refusedAt
	if c.rate < near && next > near {
		next, c.step = near, learnStep/2
	} else {
		c.step = min(2*c.step, 1)
	}
	next = min(next, c.ceiling())
	if c.announced == 0 && c.refusedAt > 0 && next >= 2*c.refusedAt {
		next = 0
	}
	l.setRate(host, st, next, now)
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
	if sig.Limit > 0 {
		l.learnQuota(host, st, sig)
	}
	if sig.Refused {
		if fresh {
			// What this host got before it was counted: at most what the
			// process sent to every host.
			c.sent.add(now, sig.Sent)
		}
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
	if r > learnMaxRate || r < 1/learnMaxWindow.Seconds() {
		return
	}
	c.announced, c.quota = r, sig.Limit
	if c.rate == 0 || c.rate > c.ceiling() {
		l.setRate(host, st, c.ceiling(), sig.Now)
	}
	if sig.Remaining >= 0 && c.rate > 0 {
		p := c.pace()
		// The bucket holds what remains at most: its next slot is no
		// earlier than the host's tokens allow.
		floor := sig.Now.Add(time.Duration(p.Burst-min(sig.Remaining, p.Burst)) * p.interval())
		if st.tat.Before(floor) {
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
	overload := sig.Wait > 0 || sig.Status == http.StatusTooManyRequests ||
		(refused >= 2 && refused >= learnNoise*sent)
	if !overload {
		return
	}
	target := learnBeta * max(sent-refused, 0)
	if sig.Wait > 0 {
		target = max(target, 1/sig.Wait.Seconds())
	}
	target = min(max(target, learnMinRate), c.ceiling())
	if now.Before(c.holdUntil) {
		// The same burst: its refusals say more of what was accepted.
		if target < c.rate {
			l.setRate(host, st, target, now)
		}
		return
	}
	offered := c.rate
	if offered == 0 {
		offered = sent
	}
	if offered > 0 {
		target = min(target, learnBeta*offered)
	}
	c.refusedAt, c.refusals = offered, true
	c.step, c.holdUntil, c.grownAt = learnStep, now.Add(learnHold), now
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
// named a wait and tells the limiter what it says of the host's capacity.
// It returns the answer for decide. A plain success costs no clock reading,
// no parsing and no call to the limiter.
func (c *call) observe(n int, resp *http.Response, err error) answer {
	t := c.t
	a := answer{n: n, resp: resp, err: err}
	if resp == nil {
		a.now = t.clock.Now()
		return a
	}
	h, code := resp.Header, resp.StatusCode
	quota := len(h["X-Ratelimit-Remaining"]) > 0 || len(h["Ratelimit-Remaining"]) > 0 ||
		len(h["Ratelimit"]) > 0 || len(h["X-Ratelimit-Limit"]) > 0
	if code < 400 && !quota && t.retryIf == nil && !t.statuses.has(code) {
		return a
	}
	now := t.clock.Now()
	a.now = now
	var q announcement
	if quota && !t.noLearning {
		q = announced(h, now)
	}
	a.wait, a.named = serverWait(resp, now, q.limit > 0)
	if a.named && a.wait > 0 {
		t.park(c.ctx, c.hostName(), now, max(a.wait, t.raFloor))
	}
	refused := code == http.StatusTooManyRequests || (code == http.StatusServiceUnavailable && !a.named)
	if t.noLearning || (!refused && q.limit == 0) {
		return a
	}
	sig := Signal{Now: now, Refused: refused, Status: code, Limit: q.limit, Window: q.window,
		Reset: q.reset, Remaining: q.remaining, Sent: t.sent.lastSecond(now)}
	if code == http.StatusTooManyRequests && a.named {
		sig.Wait = max(a.wait, t.raFloor)
	}
	if _, lerr := t.limiter.Learn(c.ctx, c.hostName(), sig); lerr != nil && t.logger != nil {
		t.logger.LogAttrs(c.ctx, slog.LevelWarn, "retryhttp: learning failed",
			slog.String("host", c.hostName()), slog.String("error", lerr.Error()))
	}
	return a
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
