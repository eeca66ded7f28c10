package retryhttp

// The simulator's host families (sim_test.go runs them). Each family draws
// its parameters from a seeded PCG and says what a perfect client with the
// same 3 tries gets from the host drawn: the ideal. The ranges are the
// claim: hosts a good learner can reasonably meet, with runs long enough
// (10 to 40 s of ideal time) that a learner's fixed costs (the first burst,
// sent before any answer; one Retry-After) do not decide the ratio, and
// workers few enough beside the pages (at most a tenth) that the first
// blind burst is not most of the run.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

type simFamily struct {
	name   string
	ranges string // the parameter ranges, for the README's table
	draw   func(r *rand.Rand) simDraw
}

func simU(r *rand.Rand, lo, hi float64) float64 { return lo + r.Float64()*(hi-lo) }
func simI(r *rand.Rand, lo, hi int) int         { return lo + r.IntN(hi-lo+1) }
func simD(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// simLatency is a request's time at the host: 5 to 50 ms, an API a region
// away.
func simLatency(r *rand.Rand) time.Duration { return simD(r, 5*time.Millisecond, 50*time.Millisecond) }

// simWorkers is 2 to 32 callers, at most a tenth of the pages.
func simWorkers(r *rand.Rand, pages int) int { return simI(r, 2, max(2, min(32, pages/10))) }

// simRunTime is the ideal run's length the pages are drawn for.
func simRunTime(r *rand.Rand) float64 { return simU(r, 10, 40) }

// How a host announces its quota.
const (
	simNoHeaders  = iota
	simXRateDelay // X-RateLimit-Limit/-Remaining/-Reset, the reset as a delay in seconds
	simXRateEpoch // the same, the reset as Unix seconds (GitHub, go-chi/httprate)
	simIETF       // RateLimit-Policy and RateLimit, of the IETF httpapi draft
)

var simHeaderNames = []string{"none", "x-ratelimit(delay)", "x-ratelimit(epoch)", "ietf"}

func simQuota(h http.Header, style, limit, remaining int, window, reset time.Duration, now time.Time) {
	remaining = max(0, min(limit, remaining))
	secs := max(0, int(math.Ceil(reset.Seconds())))
	switch style {
	case simXRateDelay, simXRateEpoch:
		h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
		if style == simXRateDelay {
			h.Set("X-RateLimit-Reset", strconv.Itoa(secs))
		} else {
			h.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(reset).Add(time.Second-1).Unix(), 10))
		}
	case simIETF:
		h.Set("RateLimit-Policy", fmt.Sprintf(`"sim";q=%d;w=%d`, limit, int(window.Seconds())))
		h.Set("RateLimit", fmt.Sprintf(`"sim";r=%d;t=%d`, remaining, secs))
	}
}

func simRetryAfter(h http.Header, wait time.Duration) {
	h.Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
}

// simFlaky fails a share p of what it serves at random with 500, 502 or
// 503 (no Retry-After), whatever the load: a broken replica.
type simFlaky struct {
	mu  sync.Mutex
	rnd *rand.Rand
	p   float64
}

func (f *simFlaky) fail() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rnd.Float64() >= f.p {
		return 0
	}
	return []int{500, 502, 503}[f.rnd.IntN(3)]
}

// simBucketHost is a token bucket (nginx limit_req, x/time/rate), whose
// rate may change at a time (capacity lost or added mid-run), optionally
// in front of a flaky replica.
type simBucketHost struct {
	simBucketCfg
	mu          sync.Mutex
	start, last time.Time
	tokens      float64
}

// simBucketCfg is a bucket's parameters, drawn before its bubble.
type simBucketCfg struct {
	rate1, rate2 float64
	change       time.Duration // when rate1 becomes rate2; 0: never
	burst        float64
	code         int
	retryAfter   bool
	headers      int
	lat          time.Duration
	behind       *simFlaky
}

func (h *simBucketHost) rateAt(t time.Time) float64 {
	if h.change > 0 && t.Sub(h.start) >= h.change {
		return h.rate2
	}
	return h.rate1
}

func (h *simBucketHost) serve(ctx context.Context) simAnswer {
	// The answer is decided under the lock and its latency slept outside
	// it: a mutex is not a durable block, and would stop the bubble's clock.
	h.mu.Lock()
	now := time.Now()
	if h.start.IsZero() {
		h.start, h.last, h.tokens = now, now, h.burst
	}
	if c := h.start.Add(h.change); h.change > 0 && h.last.Before(c) && now.After(c) {
		h.tokens = min(h.burst, h.tokens+c.Sub(h.last).Seconds()*h.rate1)
		h.last = c
	}
	rate := h.rateAt(now)
	h.tokens = min(h.burst, h.tokens+now.Sub(h.last).Seconds()*rate)
	h.last = now
	a := simAnswer{status: http.StatusOK, header: http.Header{}}
	// A microsecond's worth of a token is forgiven: time is counted in
	// whole nanoseconds, and a client sending at exactly the rate would
	// otherwise be refused for their rounding.
	if h.tokens >= 1-1e-6 {
		h.tokens--
	} else {
		a.status = h.code
		if h.retryAfter {
			simRetryAfter(a.header, time.Duration((1-h.tokens)/rate*float64(time.Second)))
		}
	}
	if h.headers != simNoHeaders {
		// A bucket announces its rate as a quota over a second, and the
		// reset as when its next token comes.
		reset := time.Duration(max(0, 1-h.tokens) / rate * float64(time.Second))
		simQuota(a.header, h.headers, max(1, int(math.Round(rate))), int(h.tokens), time.Second, reset, now)
	}
	h.mu.Unlock()
	if simSleep(ctx, h.lat) != nil {
		return a
	}
	if a.status == http.StatusOK && h.behind != nil {
		if code := h.behind.fail(); code != 0 {
			a.status = code
		}
	}
	return a
}

// simBucketFamily draws a bucket: rate 1 to 20 a second (a strict API to
// most public APIs' per-client limit; whole numbers, as quotas are
// announced), burst 1 to twice the rate. The perfect client sends the
// burst at once and then one a 1/rate: ideal (pages-burst)/rate, or the
// workers' own pace if that is slower, and one latency.
func simBucketFamily(name, ranges string, code func(*rand.Rand) int, ra func(*rand.Rand) bool, headers func(*rand.Rand) int) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		rate := float64(simI(r, 1, 20))
		burst := simI(r, 1, max(1, int(2*rate)))
		pages := burst + int(rate*simRunTime(r))
		h := &simBucketCfg{rate1: rate, burst: float64(burst), code: code(r), retryAfter: ra(r), headers: headers(r), lat: simLatency(r)}
		w := simWorkers(r, pages)
		ideal := simIdealPaced(float64(pages-burst)/rate, pages, w, h.lat)
		return simDraw{
			params: fmt.Sprintf("bucket rate %.0f/s burst %d, refuses %d, Retry-After %v, headers %s, latency %v; %d pages, %d workers",
				rate, burst, h.code, h.retryAfter, simHeaderNames[h.headers], h.lat, pages, w),
			mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
			pages: pages, workers: w, ideal: ideal, slow: 1.3, need: float64(pages), minGot: pages,
		}
	}}
}

// simIdealPaced is a paced host's ideal: the pace's time, or the workers'
// one page per latency each if that is slower, and the last latency.
func simIdealPaced(paced float64, pages, workers int, lat time.Duration) time.Duration {
	byWorkers := time.Duration((pages+workers-1)/workers) * lat
	return max(time.Duration(paced*float64(time.Second)), byWorkers) + lat
}

// simWeightedAt is when the perfect client sends page i to a weighted
// count of limit a window (windows aligned on the bubble's start): the
// first window's limit at once; then, in each window after, limit-1, the
// j-th at (j+1)/limit of the window. Its count, the last window's weighted
// by what the sliding window still covers plus this one's, rounded, is
// then limit-1 at most at every send. The first window's burst is still
// counted, weighted, all the next window: nothing more goes before it.
func simWeightedAt(i, limit int, window time.Duration) time.Duration {
	if i < limit {
		return 0
	}
	m := i - limit
	k, j := m/(limit-1), m%(limit-1)
	return time.Duration(k+1)*window + time.Duration(j+1)*window/time.Duration(limit)
}

func simAlways[T any](v T) func(*rand.Rand) T { return func(*rand.Rand) T { return v } }
func simCoin(r *rand.Rand) bool               { return r.IntN(2) == 0 }
func simOneOf[T any](vs ...T) func(*rand.Rand) T {
	return func(r *rand.Rand) T { return vs[r.IntN(len(vs))] }
}

// simWindowHost counts requests over a window: fixed (a counter per
// window, ulule/limiter and most API gateways), weighted (go-chi/httprate's
// and HAProxy's sliding count: the last window's count weighted by how
// much of it the sliding window still covers, plus this window's, rounded),
// or a log (every request of the last window, exactly). counting: refused
// requests count too (HAProxy's sc_http_req_rate), so a client that keeps
// sending past the limit is refused for as long as it does.
type simWindowHost struct {
	simWindowCfg
	mu        sync.Mutex
	cur, prev int       // fixed and weighted: this window's count and the last's
	curStart  time.Time // fixed and weighted: when this window began
	log       []time.Time
}

// simWindowCfg is a window's parameters, drawn before its bubble.
type simWindowCfg struct {
	kind       string // "fixed", "weighted", "log"
	limit      int
	window     time.Duration
	counting   bool
	retryAfter bool
	headers    int
	lat        time.Duration
}

func (h *simWindowHost) serve(ctx context.Context) simAnswer {
	h.mu.Lock()
	now := time.Now()
	a := simAnswer{status: http.StatusOK, header: http.Header{}}
	var count int
	var reset, wait time.Duration
	switch h.kind {
	case "fixed", "weighted":
		// Windows are aligned on the epoch, as a counter keyed by
		// now/window is; the bubble's clock starts on one.
		start := now.Truncate(h.window)
		if n := int(start.Sub(h.curStart) / h.window); n > 0 {
			h.prev = 0
			if n == 1 {
				h.prev = h.cur
			}
			h.cur, h.curStart = 0, start
		}
		count = h.cur
		if h.kind == "weighted" {
			left := float64(h.window-now.Sub(h.curStart)) / float64(h.window)
			count = int(math.Round(float64(h.prev)*left + float64(h.cur)))
		}
		reset = h.curStart.Add(h.window).Sub(now)
		wait = reset
		if h.kind == "weighted" {
			wait = h.window // httprate names its whole window as the wait
		}
	case "log":
		cut := 0
		for cut < len(h.log) && !h.log[cut].After(now.Add(-h.window)) {
			cut++
		}
		h.log = h.log[cut:]
		count = len(h.log)
		if count > 0 {
			reset = h.log[0].Add(h.window).Sub(now)
		}
		wait = reset
	}
	allowed := count < h.limit
	if allowed || h.counting {
		if h.kind == "log" {
			h.log = append(h.log, now)
		} else {
			h.cur++
		}
	}
	if !allowed {
		a.status = http.StatusTooManyRequests
		if h.retryAfter {
			simRetryAfter(a.header, wait)
		}
	}
	if h.headers != simNoHeaders {
		rem := h.limit - count
		if allowed {
			rem--
		}
		simQuota(a.header, h.headers, h.limit, rem, h.window, reset, now)
	}
	h.mu.Unlock()
	simSleep(ctx, h.lat)
	return a
}

// simWindowFamily draws a window of 1, 2, 5 or 10 s (minutes would make a
// 10-40 s run one window) at 1 to 20 requests a second. The perfect client
// sends a fixed window's or a log's quota at once, a window apart: ideal
// (ceil(pages/limit)-1) windows. A weighted count holds, at a steady pace,
// the pace's count at every instant and refuses at its rounded limit: ideal
// the first window's limit at once, then, from the next window (the first's
// burst still counts until then), limit-1 a window (the README's "one
// fewer a window"): simWeightedAt.
func simWindowFamily(name, ranges string, kind func(*rand.Rand) string, counts func(*rand.Rand) bool, headers func(*rand.Rand) int) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		k, counting := kind(r), counts(r)
		window := []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second}[r.IntN(4)]
		limit := simI(r, 1, 20) * int(window/time.Second)
		if k == "weighted" {
			limit = max(limit, 2) // a weighted limit of 1 rounds to none at half its window
		}
		runT := simRunTime(r)
		pages := max(limit+1, int(runT*float64(limit)/window.Seconds()))
		h := &simWindowCfg{kind: k, limit: limit, window: window, counting: counting, retryAfter: simCoin(r), headers: headers(r), lat: simLatency(r)}
		w := simWorkers(r, pages)
		var paced float64
		if k == "weighted" {
			paced = simWeightedAt(pages-1, limit, window).Seconds()
		} else {
			paced = float64((pages+limit-1)/limit-1) * window.Seconds()
		}
		slow := 1.3
		if counting && k != "fixed" { // a fixed window forgets its refusals at its end: no lockout
			slow = 1.5
		}
		return simDraw{
			params: fmt.Sprintf("%s window %d per %v, counts refusals %v, Retry-After %v, headers %s, latency %v; %d pages, %d workers",
				k, limit, window, counting, h.retryAfter, simHeaderNames[h.headers], h.lat, pages, w),
			mk:    func() simHost { return &simWindowHost{simWindowCfg: *h} },
			pages: pages, workers: w, ideal: simIdealPaced(paced, pages, w, h.lat), slow: slow, need: float64(pages), minGot: pages,
		}
	}}
}

// simSlotsHost serves n requests at once, each for service; beyond them it
// queues up to queue (FIFO, as Go's channel senders wait), each at most
// timeout (HAProxy maxconn and timeout queue), and refuses the rest at once
// with code (503, or 429 as go-chi's Throttle).
type simSlotsHost struct {
	n, queue int
	service  time.Duration
	timeout  time.Duration
	code     int
	slots    chan struct{}
	mu       sync.Mutex
	waiting  int
}

func (h *simSlotsHost) serve(ctx context.Context) simAnswer {
	refuse := simAnswer{status: h.code}
	select {
	case h.slots <- struct{}{}:
	default:
		h.mu.Lock()
		if h.waiting >= h.queue {
			h.mu.Unlock()
			simSleep(ctx, time.Millisecond)
			return refuse
		}
		h.waiting++
		h.mu.Unlock()
		tm := time.NewTimer(h.timeout)
		var ok bool
		select {
		case h.slots <- struct{}{}:
			ok = true
		case <-tm.C:
		case <-ctx.Done():
		}
		tm.Stop()
		h.mu.Lock()
		h.waiting--
		h.mu.Unlock()
		if !ok {
			return simAnswer{status: http.StatusServiceUnavailable}
		}
	}
	defer func() { <-h.slots }()
	simSleep(ctx, h.service)
	return simAnswer{status: http.StatusOK}
}

// simSlotsFamily draws 1 to 8 slots serving 2 to 25 requests a second in
// all (a service time of at least 20 ms), and more workers than slots (up
// to four times as many and 32): the perfect client keeps every slot busy
// and sends nothing beyond them: ideal ceil(pages/slots) service times.
func simSlotsFamily(name, ranges string, queued bool) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		n := simI(r, 1, 8)
		service := max(20*time.Millisecond, time.Duration(float64(n)/simU(r, 2, 25)*float64(time.Second)))
		pages := int(simRunTime(r) * float64(n) / service.Seconds())
		w := simI(r, n+1, max(n+1, min(4*n, 32, pages/10)))
		h := &simSlotsHost{n: n, service: service, timeout: time.Hour, code: simOneOf(503, 429)(r)}
		if queued {
			// HAProxy queues and answers 503 past its queue or its timeout,
			// commonly a few seconds: at least one service time.
			h.queue = simI(r, 1, 2*n)
			h.timeout = simD(r, service, 10*time.Second)
			h.code = http.StatusServiceUnavailable
			w = simI(r, n+1, max(n+1, min(3*(n+h.queue), 48, pages/10)))
		}
		ideal := time.Duration((pages+n-1)/n) * service
		return simDraw{
			params: fmt.Sprintf("%d slots of %v, queue %d (timeout %v), refuses %d; %d pages, %d workers",
				n, service, h.queue, h.timeout, h.code, pages, w),
			mk: func() simHost {
				c := &simSlotsHost{n: h.n, queue: h.queue, service: h.service, timeout: h.timeout, code: h.code}
				c.slots = make(chan struct{}, c.n)
				return c
			},
			pages: pages, workers: w, ideal: ideal, slow: 1.3, need: float64(pages), minGot: pages,
		}
	}}
}

// simFlakyHost fails a share of its answers at random, whatever the load.
type simFlakyHost struct {
	f   *simFlaky
	lat time.Duration
}

func (h *simFlakyHost) serve(ctx context.Context) simAnswer {
	simSleep(ctx, h.lat)
	if code := h.f.fail(); code != 0 {
		return simAnswer{status: code}
	}
	return simAnswer{status: http.StatusOK}
}

// simBackoffMean is the default backoff's mean wait before the second and
// the third try (full jitter over 500 ms, then over 1 s): the perfect
// client has the same backoff, as it is no host's to learn.
var simBackoffMean = [2]float64{0.25, 0.5}

// simFailurePage is a page's expected time with 3 tries against a share
// p of failures: each try's latency and the backoffs between them.
func simFailurePage(p float64, lat time.Duration) float64 {
	return lat.Seconds()*(1+p+p*p) + simBackoffMean[0]*p + simBackoffMean[1]*p*p
}

// simMinGot is the fewest pages a perfect client with 3 tries gets of n
// against a share p of failures, but for a chance under 1 in 30000: the
// expected n(1-p³) less 4 standard deviations.
func simMinGot(n int, p float64) int {
	q := 1 - p*p*p
	return int(math.Floor(float64(n)*q - 4*math.Sqrt(float64(n)*q*(1-q))))
}

// simFailureFamily draws a share of 1 % to 60 % (the README's claim: 60 %
// at random is never taken for down) failing with 500, 502 or 503, on an
// endpoint of 20 to 200 ms (a slow one, where a retry's cost shows), with 2
// to 8 workers; pages for 10-40 s of ideal time, 100 to 1000. A perfect
// client gets n(1-p³) pages with n/(1-p) requests at most (R18's need),
// in n/workers pages' expected time each.
func simFailureFamily(name, ranges string) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		p := simU(r, 0.01, 0.6)
		lat := simD(r, 20*time.Millisecond, 200*time.Millisecond)
		w := simI(r, 2, 8)
		per := simFailurePage(p, lat)
		pages := max(100, min(1000, int(simRunTime(r)*float64(w)/per)))
		seed := r.Uint64()
		ideal := time.Duration(float64(pages)/float64(w)*per*float64(time.Second)) + lat
		return simDraw{
			params: fmt.Sprintf("fails %.1f %% at random, latency %v; %d pages, %d workers", 100*p, lat, pages, w),
			mk: func() simHost {
				return &simFlakyHost{f: &simFlaky{rnd: rand.New(rand.NewPCG(seed, 1)), p: p}, lat: lat}
			},
			pages: pages, workers: w, ideal: ideal, slow: 1.3, need: float64(pages) / (1 - p), minGot: simMinGot(pages, p),
		}
	}}
}

// simOutageHost is healthy but for [from, to) after its start, when it
// answers 503 to all or refuses every connection.
type simOutageHost struct {
	start    time.Time
	from, to time.Duration
	refuse   bool
	lat      time.Duration
}

func (h *simOutageHost) serve(ctx context.Context) simAnswer {
	at := time.Since(h.start)
	out := at >= h.from && at < h.to
	if out && h.refuse {
		return simAnswer{refused: true}
	}
	simSleep(ctx, h.lat)
	if out {
		return simAnswer{status: http.StatusServiceUnavailable}
	}
	return simAnswer{status: http.StatusOK}
}

// simOutageGrace is how long after an outage a page may still be handed
// back: the Transport probes a down host every 500 ms.
const simOutageGrace = 500 * time.Millisecond

// simOutageFamily draws pages arriving at 5 to 30 a second (callers over
// time, not a backlog: with a backlog every page would be handed back
// during the outage and none left after it), an outage of 1 to 15 s (at
// most a third of the run) starting 20 % to 60 % into it, and workers
// enough that a page's 3 tries (about 2 s with their backoff) hold up no
// arrival. The perfect client gets every page done before the outage and
// every page sent after it (and its grace), with 3 requests for each page
// during it and one for the rest, in the arrivals' time.
func simOutageFamily(name, ranges string, refuse bool) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		rate := simU(r, 5, 30)
		runT := simRunTime(r)
		pages := int(rate * runT)
		from := time.Duration(simU(r, 0.2, 0.6) * runT * float64(time.Second))
		length := simD(r, time.Second, time.Duration(min(15, runT/3)*float64(time.Second)))
		lat := simLatency(r)
		w := int(math.Ceil(2*rate)) + 2
		during := rate * length.Seconds()
		to := from + length
		return simDraw{
			params: fmt.Sprintf("outage (refused %v) from %v for %v, latency %v; %d pages arriving %.1f/s, %d workers",
				refuse, from.Round(time.Millisecond), length.Round(time.Millisecond), lat, pages, rate, w),
			mk: func() simHost {
				return &simOutageHost{start: time.Now(), from: from, to: to, refuse: refuse, lat: lat}
			},
			pages: pages, workers: w, arrive: time.Duration(float64(time.Second) / rate),
			ideal: time.Duration(float64(pages-1)/rate*float64(time.Second)) + lat, slow: 1.3,
			need: float64(pages) + 2*during,
			owed: func(p simPage) bool {
				return p.start+p.dur <= from || p.start >= to+simOutageGrace+lat
			},
		}
	}}
}

// simChangeFamily draws a bucket whose rate jumps, 30 % to 60 % into the
// run, to a quarter to four times what it was (a replica lost or added),
// rate 1 to 20 a second before: ideal the burst, the first rate until the
// change, the second after.
func simChangeFamily(name, ranges string) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		r1 := float64(simI(r, 1, 20))
		r2 := max(1, math.Round(r1*math.Exp(simU(r, math.Log(0.25), math.Log(4)))))
		burst := simI(r, 1, max(1, int(2*r1)))
		runT := simRunTime(r)
		tc := simU(r, 0.3, 0.6) * runT
		pages := burst + int(r1*tc+r2*(runT-tc))
		h := &simBucketCfg{rate1: r1, rate2: r2, change: time.Duration(tc * float64(time.Second)), burst: float64(burst),
			code: http.StatusTooManyRequests, retryAfter: simCoin(r), headers: r.IntN(4), lat: simLatency(r)}
		w := simWorkers(r, pages)
		paced := tc + (float64(pages-burst)-r1*tc)/r2
		return simDraw{
			params: fmt.Sprintf("bucket rate %.0f/s then %.0f/s from %.1fs, burst %d, Retry-After %v, headers %s, latency %v; %d pages, %d workers",
				r1, r2, tc, burst, h.retryAfter, simHeaderNames[h.headers], h.lat, pages, w),
			mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
			pages: pages, workers: w, ideal: simIdealPaced(paced, pages, w, h.lat), slow: 1.3, need: float64(pages), minGot: pages,
		}
	}}
}

// simComboFamily draws a bucket (rate 1 to 20 a second, 429, Retry-After or
// not, announced or not) in front of a replica failing 5 % to 40 % at
// random: every try spends a token, so the perfect client's n(1+p+p²)
// tries take the bucket's time, or the backoffs' if slower.
func simComboFamily(name, ranges string) simFamily {
	return simFamily{name: name, ranges: ranges, draw: func(r *rand.Rand) simDraw {
		rate := float64(simI(r, 1, 20))
		burst := simI(r, 1, max(1, int(2*rate)))
		p := simU(r, 0.05, 0.4)
		tries := 1 + p + p*p
		pages := int((float64(burst) + rate*simRunTime(r)) / tries)
		seed := r.Uint64()
		h := &simBucketCfg{rate1: rate, burst: float64(burst), code: http.StatusTooManyRequests, retryAfter: simCoin(r),
			headers: simOneOf(simNoHeaders, simXRateDelay)(r), lat: simLatency(r)}
		w := simWorkers(r, pages)
		paced := max((float64(pages)*tries-float64(burst))/rate, float64(pages)/float64(w)*simFailurePage(p, h.lat))
		return simDraw{
			params: fmt.Sprintf("bucket rate %.0f/s burst %d, Retry-After %v, headers %s, before a replica failing %.1f %%, latency %v; %d pages, %d workers",
				rate, burst, h.retryAfter, simHeaderNames[h.headers], 100*p, h.lat, pages, w),
			mk: func() simHost {
				c := *h
				c.behind = &simFlaky{rnd: rand.New(rand.NewPCG(seed, 1)), p: p}
				return &simBucketHost{simBucketCfg: c}
			},
			pages: pages, workers: w, ideal: simIdealPaced(paced, pages, w, h.lat), slow: 1.3,
			need: float64(pages) / (1 - p), minGot: simMinGot(pages, p),
		}
	}}
}

// simFamilies is every family the simulator draws from; the ranges are
// repeated for the README's table.
var simFamilies = []simFamily{
	simBucketFamily("bucket429", "rate 1-20/s, burst 1-2×rate, 429, Retry-After or not",
		simAlways(http.StatusTooManyRequests), simCoin, simAlways(simNoHeaders)),
	simBucketFamily("bucketHeaders", "rate 1-20/s, burst 1-2×rate, 429 or 503, Retry-After or not, X-RateLimit-* or RateLimit",
		simOneOf(http.StatusTooManyRequests, http.StatusServiceUnavailable), simCoin, simOneOf(simXRateDelay, simXRateEpoch, simIETF)),
	simBucketFamily("bucket503RetryAfter", "rate 1-20/s, burst 1-2×rate, 503 with Retry-After",
		simAlways(http.StatusServiceUnavailable), simAlways(true), simAlways(simNoHeaders)),
	simBucketFamily("bucket503Bare", "rate 1-20/s, burst 1-2×rate, 503 and nothing else (nginx limit_req)",
		simAlways(http.StatusServiceUnavailable), simAlways(false), simAlways(simNoHeaders)),
	simWindowFamily("fixedWindow", "1-20/s over 1, 2, 5 or 10 s, 429, Retry-After or not, any headers, counting refusals or not",
		simAlways("fixed"), simCoin, simOneOf(simNoHeaders, simXRateDelay, simXRateEpoch, simIETF)),
	simWindowFamily("slidingWeighted", "1-20/s over 1, 2, 5 or 10 s (go-chi/httprate), 429, Retry-After or not, X-RateLimit-* or none",
		simAlways("weighted"), simAlways(false), simOneOf(simNoHeaders, simXRateEpoch)),
	simWindowFamily("slidingLog", "1-20/s over 1, 2, 5 or 10 s, exact log, 429, Retry-After or not, any headers",
		simAlways("log"), simAlways(false), simOneOf(simNoHeaders, simXRateDelay, simXRateEpoch, simIETF)),
	simWindowFamily("slidingCounting", "weighted or log, 1-20/s over 1, 2, 5 or 10 s, counting its refusals (HAProxy sc_http_req_rate), 429",
		simOneOf("weighted", "log"), simAlways(true), simOneOf(simNoHeaders, simXRateEpoch)),
	simSlotsFamily("inFlight", "1-8 slots, 2-25 req/s in all, no queue: 503 or 429 at once; workers slots+1 to 4×slots", false),
	simSlotsFamily("inFlightQueue", "1-8 slots, 2-25 req/s, queue 1-2×slots, timeout 1 service-10 s, then 503 (HAProxy)", true),
	simFailureFamily("randomFailures", "1-60 % of 500/502/503 at random, 20-200 ms, 2-8 workers"),
	simOutageFamily("outage503", "pages at 5-30/s, 503 to all for 1-15 s from 20-60 % in", false),
	simOutageFamily("outageRefused", "pages at 5-30/s, connections refused for 1-15 s from 20-60 % in", true),
	simChangeFamily("capacityChange", "bucket 1-20/s, then ×0.25-4 from 30-60 % in, 429, any headers"),
	simComboFamily("bucketFlakyReplica", "bucket 1-20/s, 429, before a replica failing 5-40 % at random"),
}

// simKnownMisses are the families the host model of 2026-12-06 misses (see
// simKnownMiss): how many of 200 draws after the defect fixes of issue 24
// (a run's goroutine order moves a count by a few), the typical miss as its
// replay's trace shows it, and that replay's seed. outageRefused is not
// here: it passed all 200. Each is a bug of the model, for its rewrite.
var simKnownMisses = map[string]simKnownMiss{
	"bucket429":           {"50-55/200: the pace learned from the first 429s starts far under the rate and grows slowly (2/s for 7 s of an 11/s bucket): 1.3-1.6x ideal; a slow start from the burst (the pace doubled, or grown by half, each hold) cost more in the window and bare-503 families than it won here", 11},
	"bucketHeaders":       {"19/200: a 1/s quota with an epoch reset is sent to a second past each reset, half its rate: 1.9x ideal, 30 s calls", 7},
	"bucket503RetryAfter": {"59-62/200: paced since a 503 naming its wait is a refusal, but the pace learned from the first burst starts low and grows slowly: time 1.3-1.6x ideal", 1},
	"bucket503Bare":       {"76-91/200: a few callers whose own backoff keeps them under twice the rate are refused a third of what they send, never over half, and the bare 503 is not taken for load: ~2 % of pages lost at 1.5 requests a page", 2},
	"fixedWindow":         {"21-25/200 (33 before a spent quota explained its refusals and a fixed window whole again sent its quota at once): a run of two 10 s windows one slot short of the second waits a third: 2.0x ideal", 6},
	"slidingWeighted":     {"39/200 (72 before a burst refused with a wait over a second was paced at what it bought over that wait, and probed past four waits later): a 10 s window naming no wait, whose refusals the pace's floor of 1/s meets a try a second, losing pages on their third refusal", 8},
	"slidingLog":          {"78-81/200 (120 two releases ago: a log announcing its quota was paced at exactly its rate and refused once a window, and an X-RateLimit window inferred a second long): without headers, the learned pace grows past the log's rate every few seconds and each refusal parks the host a second: 1.3-1.4x ideal", 2},
	"slidingCounting":     {"52-57/200 (61 before this release): a count of its own refusals is held over its limit by the retries and the probes: 1.6x ideal, pages lost", 1},
	"inFlight":            {"57-62/200 (92 before refusals that came back at once held the refused for a slot): a slot answering within slotsGap of the refusals is not told from a bucket, and its 429s are paced as a rate from the burst: pages lost, or 1.5x ideal", 1},
	"inFlightQueue":       {"42-45/200 (56 before the hold for a slot): the queue's timeouts, 503s past slots and queue, lose pages in its busiest seconds", 4},
	"outage503":           {"0/200; 2 of 400 (held-out seeds): a page owed, sent as the outage began, whose tries all fell in it", 222},
	"randomFailures":      {"53-55/200: over ~50 % failures the retry budget (R8, 10 % of first tries) withholds the retries a perfect client without one makes (each logged and given to OnGiveUp as \"retry budget spent\"): pages that client gets are lost", 16},
	"capacityChange":      {"39-45/200: a rise is not found soon enough (1/s to 4/s at 15 s: 2.3x ideal). A fall under a pace named by parking refusals (14/s to 8/s: one refused a second, each parking the host, for 4 min, seed 7) is cut for now (TestParkingRefusalIsNotNoise)", 6},
	"bucketFlakyReplica":  {"27-32/200: the pace learned from the opening burst starts under the rate and grows slowly (7.2/s of 12/s for 7 s): 1.3-1.7x ideal", 0},
}
