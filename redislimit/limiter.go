// Package redislimit is a retryhttp.Limiter that shares each host's pace
// and parking across processes through Redis, so that fifty workers behind
// one egress IP keep to one pace between them and all stop when one of them
// is told to come back later.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	client := retryhttp.NewClient(
//		retryhttp.WithLimiter(redislimit.New(rdb)),
//		retryhttp.WithPace(10, 1), // 10 requests a second per host, for all processes together
//	)
//
// The pace stays in retryhttp.WithPace and WithHostPace; the Limiter
// enforces it. Each attempt costs one EVALSHA round trip to Redis, which
// checks the host's parking and takes its slot in one step (GCRA on the
// Redis server's clock). When Redis does not answer within a short timeout,
// the Limiter paces in process instead, logs one warning, and goes back to
// Redis once it answers again.
package redislimit

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"golang.org/x/time/rate"
)

// Defaults.
const (
	// DefaultPrefix starts every key the Limiter writes.
	DefaultPrefix = "retryhttp:"
	// DefaultTimeout bounds each call to Redis. A loopback or same-zone
	// round trip takes well under a millisecond; a Redis that has not
	// answered in 50 ms is taken to be down.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultProbeInterval is how often a Limiter that fell back to pacing
	// in process asks Redis again.
	DefaultProbeInterval = time.Second
	// warnInterval is the least time between two warnings about Redis.
	warnInterval = time.Minute
)

// Limiter is a retryhttp.Limiter backed by Redis. Make one with New and
// share it between the Transports of a process; it is safe for concurrent
// use. New starts no goroutine: the workers that call a client without
// ContextTimeoutEnabled start with the first call and leave when idle, and
// one goroutine hands Redis the parkings set during an outage when it
// answers again.
type Limiter struct {
	rdb      redis.UniversalClient
	prefix   string
	timeout  time.Duration
	probe    time.Duration
	logger   *slog.Logger
	share    int
	direct   bool // the client bounds its calls by the context's deadline
	mem      memory
	start    time.Time    // origin of the clock readings below
	down     atomic.Bool  // pacing in process: Redis failed and has not answered since
	probeAt  atomic.Int64 // when down: the next call to try Redis, in ns since start
	warnedAt atomic.Int64 // the last warning, in ns since start
	unsaid   atomic.Bool  // a warning was logged and its recovery not yet
	flushing atomic.Bool
	calls    chan *call   // to idle workers; see run
	workers  atomic.Int32 // workers running
}

var _ retryhttp.Limiter = (*Limiter)(nil)

// Option configures a Limiter.
type Option func(*Limiter)

// WithPrefix sets the prefix of the Limiter's keys (default "retryhttp:").
// Each host is one key, prefix + host ("retryhttp:api.example.com"), so
// processes that must share a pace must share the prefix, and processes
// that must not, say two tenants on one Redis, need different ones.
func WithPrefix(prefix string) Option {
	return func(l *Limiter) { l.prefix = prefix }
}

// WithTimeout bounds each call to Redis (default 50 ms). A call that takes
// longer counts as a failure: the attempt is paced in process instead. Zero
// or less means the default.
func WithTimeout(d time.Duration) Option {
	return func(l *Limiter) { l.timeout = d }
}

// WithProbeInterval sets how often, while pacing in process after a
// failure, one call tries Redis again (default 1 s). Zero or less means the
// default.
func WithProbeInterval(d time.Duration) Option {
	return func(l *Limiter) { l.probe = d }
}

// WithLogger sets the logger for the Limiter's own news: a warning when
// Redis fails and the Limiter starts pacing in process (at most one a
// minute however many requests see it), and a line when Redis answers
// again. nil, the default, logs nothing.
func WithLogger(logger *slog.Logger) Option {
	return func(l *Limiter) { l.logger = logger }
}

// WithFallbackShare sets how many processes are expected to share a host's
// pace. While Redis does not answer, each process paces on its own at
// 1/n of the pace (and 1/n of the burst, at least 1), so that n processes
// together still keep to it. The default, 1, gives each process the whole
// pace during an outage: n processes then send up to n times the pace, but
// a single one is never slowed by an outage. Values below 1 mean 1.
func WithFallbackShare(n int) Option {
	return func(l *Limiter) { l.share = n }
}

// New returns a Limiter that keeps its state in rdb, which may be a
// *redis.Client, a *redis.ClusterClient (each host is a single key, so every
// script runs on one slot), a failover client or a *redis.Ring. A nil rdb
// makes a Limiter that always paces in process.
//
// Each call to Redis is bounded by the Limiter's timeout whatever the
// client's own timeouts. A client made with ContextTimeoutEnabled honours
// the deadline itself and is called directly; any other is called from a
// few long-lived worker goroutines, started when first needed, which costs
// a hand-over per call (about 10 µs here).
func New(rdb redis.UniversalClient, opts ...Option) *Limiter {
	l := &Limiter{rdb: rdb, prefix: DefaultPrefix, start: time.Now(), calls: make(chan *call)}
	for _, o := range opts {
		if o != nil {
			o(l)
		}
	}
	if l.timeout <= 0 {
		l.timeout = DefaultTimeout
	}
	if l.probe <= 0 {
		l.probe = DefaultProbeInterval
	}
	l.share = max(l.share, 1)
	l.direct = contextAware(rdb)
	l.warnedAt.Store(math.MinInt64 / 2)
	return l
}

// Fallback reports whether the Limiter is pacing in process because Redis
// failed and has not answered since.
func (l *Limiter) Fallback() bool {
	return l.rdb == nil || l.down.Load()
}

// Reserve takes one slot for a.Host at a.Pace, shared with every process
// that uses the same Redis and prefix, unless the host is parked or the slot
// would come after a.Latest. Parking and slot are settled by one script, in
// one round trip. When Redis fails, the slot is taken in process instead and
// the error is not returned: only the end of ctx is.
func (l *Limiter) Reserve(ctx context.Context, a retryhttp.Attempt) (retryhttp.Reservation, error) {
	if a.CheckOnly {
		a.Pace = retryhttp.Pace{} // the parking alone: no slot
	}
	if until, ok := l.mem.parkedUntil(a.Host, a.Now); ok {
		return retryhttp.Reservation{ParkedUntil: until}, nil
	}
	if !l.useRedis() {
		return l.mem.reserve(a, l.fallbackPace(a.Pace)), nil
	}
	var (
		interval time.Duration
		burst    int
	)
	if !a.Pace.Unlimited() {
		interval, burst = gcra(a.Pace)
	}
	bound := "" // no bound
	if !a.Latest.IsZero() {
		if d := a.Latest.Sub(a.Now); d >= 0 {
			bound = strconv.FormatInt(int64(d/time.Microsecond), 10)
		} else {
			bound = "-1" // no slot is early enough, not even one now
		}
	}
	ahead := "" // the in-process pacer has no slots still to come
	if interval > 0 {
		if d := l.mem.horizon(a.Host, a.Now); d > 0 {
			ahead = strconv.FormatInt(int64(d/time.Microsecond), 10)
		}
	}
	start := time.Now()
	res, err := l.run(ctx, reserveScript, l.prefix+a.Host,
		int64(interval/time.Microsecond), burst, bound, ahead)
	if err == nil && len(res) < 2 {
		err = fmt.Errorf("redislimit: unexpected answer from the reserve script: %v", res)
	}
	// Delay is counted from a.Now, and the call took elapsed. Redis counts
	// from its own now, some moment during the call: taking it to be the
	// moment the answer came, the latest it can be, never starts an attempt
	// early.
	elapsed := time.Since(start)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return retryhttp.Reservation{}, cerr
		}
		l.fail(err)
		// The in-process pacer counts from now, not from before the
		// failed call: a slot counted from a.Now would be up to a timeout
		// in the past, and its attempt would go out with the next one.
		b := a
		b.Now = a.Now.Add(elapsed)
		r := l.mem.reserve(b, l.fallbackPace(a.Pace))
		if r.Delay > 0 || r.OK {
			r.Delay += elapsed
		}
		return r, nil
	}
	l.answered()
	d := time.Duration(res[1]) * time.Microsecond
	switch res[0] {
	case codeParked:
		until := a.Now.Add(elapsed + d)
		l.mem.park(a.Host, until) // no need to ask Redis again before then
		return retryhttp.Reservation{ParkedUntil: until}, nil
	case codeLate:
		return retryhttp.Reservation{Delay: elapsed + d}, nil
	}
	if interval > 0 {
		local, _ := gcra(l.fallbackPace(a.Pace))
		l.mem.follow(a.Host, a.Now, a.Now.Add(elapsed+d), local)
	}
	if d == 0 {
		// The slot is Redis's now, already past: go at once.
		return retryhttp.Reservation{OK: true}, nil
	}
	r := retryhttp.Reservation{OK: true, Delay: elapsed + d}
	if len(res) == 3 {
		key, mine, us := l.prefix+a.Host, res[2], int64(interval/time.Microsecond)
		r.Cancel = func(time.Time) { l.cancel(key, mine, us) }
	}
	return r, nil
}

// cancel gives back a slot that a request, cancelled while it waited, will
// not use, if no later slot was taken; see cancelScript. A failure leaves
// the slot taken, which slows the others by one slot at most.
func (l *Limiter) cancel(key string, mine, interval int64) {
	if !l.useRedis() {
		return
	}
	if _, err := l.run(context.Background(), cancelScript, key, mine, interval); err != nil {
		l.fail(err)
		return
	}
	l.answered()
}

// Park closes host to every process until the given moment; a moment
// earlier than an existing parking does not shorten it. The parking holds
// in this process at once, and in Redis for the rest of its length, counted
// on Redis's clock. When Redis fails, the parking holds in this process and
// is handed to Redis when it answers again; no error is returned.
func (l *Limiter) Park(ctx context.Context, host string, until time.Time) error {
	l.mem.park(host, until)
	rest := time.Until(until)
	if rest <= 0 || !l.useRedis() {
		return nil
	}
	// The parking matters to every process, not only to the request that
	// learnt of it: it is recorded even if that request is cancelled.
	if err := l.parkRedis(context.WithoutCancel(ctx), host, rest); err != nil {
		l.fail(err)
		return nil
	}
	l.answered()
	return nil
}

func (l *Limiter) parkRedis(ctx context.Context, host string, rest time.Duration) error {
	us := int64((rest + time.Microsecond - 1) / time.Microsecond)
	_, err := l.run(ctx, parkScript, l.prefix+host, us)
	return err
}

// fallbackPace is the pace of the in-process pacer: the WithFallbackShare
// part of p.
func (l *Limiter) fallbackPace(p retryhttp.Pace) retryhttp.Pace {
	if l.share == 1 || p.Unlimited() {
		return p
	}
	return retryhttp.Pace{Limit: p.Limit / rate.Limit(l.share), Burst: max(1, p.Burst/l.share)}
}

// useRedis reports whether this call should go to Redis: always while
// Redis answers, and once per probe interval while it does not.
func (l *Limiter) useRedis() bool {
	if l.rdb == nil {
		return false
	}
	if !l.down.Load() {
		return true
	}
	now := int64(time.Since(l.start))
	at := l.probeAt.Load()
	return now >= at && l.probeAt.CompareAndSwap(at, now+int64(l.probe))
}

// fail records a failed call: pace in process, and warn unless a warning
// was given in the last minute.
func (l *Limiter) fail(err error) {
	now := int64(time.Since(l.start))
	l.probeAt.Store(now + int64(l.probe))
	l.down.Store(true)
	if l.logger == nil {
		return
	}
	last := l.warnedAt.Load()
	if now-last < int64(warnInterval) || !l.warnedAt.CompareAndSwap(last, now) {
		return
	}
	l.unsaid.Store(true)
	l.logger.LogAttrs(context.Background(), slog.LevelWarn,
		"redislimit: Redis failed; pacing in process until it answers",
		slog.String("error", err.Error()),
		slog.Duration("probe_every", l.probe))
}

// answered records a call that Redis answered: back to Redis, if the
// Limiter was pacing in process.
func (l *Limiter) answered() {
	if !l.down.Load() || !l.down.CompareAndSwap(true, false) {
		return
	}
	if l.unsaid.Swap(false) && l.logger != nil {
		l.logger.LogAttrs(context.Background(), slog.LevelInfo,
			"redislimit: Redis answers again; pacing shared")
	}
	if l.mem.parkings(time.Now()) != nil && l.flushing.CompareAndSwap(false, true) {
		go l.flush()
	}
}

// flush hands Redis the parkings this process knows of, those set while
// Redis was down among them, so that other processes see them too.
func (l *Limiter) flush() {
	defer l.flushing.Store(false)
	for host, until := range l.mem.parkings(time.Now()) {
		rest := time.Until(until)
		if rest <= 0 {
			continue
		}
		if err := l.parkRedis(context.Background(), host, rest); err != nil {
			l.fail(err)
			return
		}
	}
}

// contextAware reports whether the client bounds a call by its context's
// deadline, so that the Limiter can call it directly.
func contextAware(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Learn learns nothing yet: hosts are paced at the configured pace and
// parked across processes, but a pace learned from quotas and refusals is
// not shared through Redis (a later change). It returns an unlimited Pace,
// as the Limiter interface asks of a Limiter that learns nothing.
func (l *Limiter) Learn(context.Context, string, retryhttp.Signal) (retryhttp.Pace, error) {
	return retryhttp.Pace{}, nil
}
