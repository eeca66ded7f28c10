// Package redislimit is a retryhttp.Limiter that shares each host's pace,
// parking and learned capacity across processes through Redis, so that
// fifty workers behind one egress IP keep to one pace between them, all
// stop when one of them is told to come back later, and together learn
// what a host that refuses can take.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	limiter := redislimit.New(rdb)
//	defer limiter.Close()
//	client := retryhttp.NewClient(
//		retryhttp.WithLimiter(limiter),
//		retryhttp.WithPace(10, 1), // 10 requests a second per host, for all processes together
//	)
//
// The pace stays in retryhttp.WithPace and WithHostPace; the Limiter
// enforces it. Each attempt costs one EVALSHA round trip to Redis, which
// checks the host's parking and takes its slot in one step (GCRA on the
// Redis server's clock); parkings set while a request waits for its slot
// reach the process through a Redis subscription, so the check after the
// wait costs nothing. When Redis does not answer within a short timeout,
// the Limiter paces in process instead, each process at its share of the
// pace, logs one warning, and goes back to Redis once it answers again.
package redislimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
)

// Defaults.
const (
	// DefaultPrefix starts every key the Limiter writes, and the name of
	// the channel it publishes parkings on (prefix + "parked").
	DefaultPrefix = "retryhttp:"
	// DefaultTimeout bounds each call to Redis. A loopback or same-zone
	// round trip takes well under a millisecond; a Redis that has not
	// answered in 50 ms is taken to be down.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultProbeInterval is how often a Limiter that fell back to pacing
	// in process asks Redis again.
	DefaultProbeInterval = time.Second
	// checkTimeout bounds the check for a parking after a request's wait,
	// when it goes to Redis at all (see Reserve).
	checkTimeout = 5 * time.Millisecond
	// warnInterval is the least time between two warnings about Redis.
	warnInterval = time.Minute
)

// Limiter is a retryhttp.Limiter backed by Redis. Make one with New, share
// it between the Transports of a process, and Close it when done; it is
// safe for concurrent use. New starts no goroutine. The first answer from
// Redis starts one that listens for parkings (with a *redis.Client or
// *redis.ClusterClient) and a short-lived one that reads Redis's eviction
// policy; a client without ContextTimeoutEnabled is called from worker
// goroutines started when needed, which leave after 10 s idle. Close stops
// them all.
type Limiter struct {
	rdb     redis.UniversalClient
	prefix  string
	channel string // where parkings are published; "" when they are not
	id      string // this Limiter among the processes sharing a host
	timeout time.Duration
	probe   time.Duration
	logger  *slog.Logger
	share   int
	direct  bool // the client bounds its calls by the context's deadline
	mem     memory
	start   time.Time // origin of the clock readings below

	down     atomic.Bool  // pacing in process: Redis failed and has not answered since
	probeAt  atomic.Int64 // when down: the next call to try Redis, in ns since start
	downAt   atomic.Int64 // when Redis last failed after answering, in ns since start
	backAt   atomic.Int64 // when Redis last answered after being down, in ns since start
	warnedAt atomic.Int64 // the last warning, in ns since start
	unsaid   atomic.Bool  // a warning was logged and its recovery not yet
	flushing atomic.Bool
	started  atomic.Bool  // the listener and the policy check were started
	peers    atomic.Int64 // live processes at the last heartbeat, any host
	// sub is the parking subscription's generation: positive while it is
	// known to be delivering, a new value each time it (re)subscribes.
	sub atomic.Int64

	calls   chan *call   // to idle workers; see run
	workers atomic.Int32 // workers running

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	closed atomic.Bool
	mu     sync.Mutex     // guards wg.Add against Close, and ps
	wg     sync.WaitGroup // the goroutines Close waits for
	ps     *redis.PubSub
}

var _ retryhttp.Limiter = (*Limiter)(nil)

// Option configures a Limiter.
type Option func(*Limiter)

// WithPrefix sets the prefix of the Limiter's keys (default "retryhttp:").
// Each host is one key, prefix + host ("retryhttp:api.example.com"), so
// processes that must share a pace must share the prefix, and processes
// that must not, say two tenants on one Redis, need different ones.
// Parkings are published on the channel prefix + "parked".
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
// minute however many requests see it), a line when Redis answers again,
// and a warning when Redis may evict the Limiter's keys. nil, the default,
// logs nothing.
func WithLogger(logger *slog.Logger) Option {
	return func(l *Limiter) { l.logger = logger }
}

// WithFallbackShare overrides how many processes share a host's pace while
// Redis does not answer: each then paces at 1/n of the pace (and 1/n of the
// burst, at least 1). Without it (or with n below 1, the default) each
// process takes the share Redis last told it: the processes using a host
// count themselves in Redis, so n needs no setting. Set it only to hold a
// share fixed whatever Redis counted, say 1 for a process that must never
// slow down in an outage.
func WithFallbackShare(n int) Option {
	return func(l *Limiter) { l.share = n }
}

// New returns a Limiter that keeps its state in rdb, which may be a
// *redis.Client, a *redis.ClusterClient (each host is a single key, so every
// script runs on one slot), a failover client or a *redis.Ring. A nil rdb
// makes a Limiter that always paces in process. New does not call Redis:
// call Check to find a misconfigured Redis at start.
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
	l.share = max(l.share, 0)
	l.direct = contextAware(rdb)
	// A Ring publishes on the shard of the host's key and subscribes on
	// the shard of the channel's name: its parkings would not arrive.
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
		l.channel = l.prefix + "parked"
	}
	// The start time first, so that ids sort by it (see reserveLua).
	var b [6]byte
	rand.Read(b[:])
	l.id = fmt.Sprintf("%016x", l.start.UnixMicro()) + hex.EncodeToString(b[:])
	l.warnedAt.Store(math.MinInt64 / 2)
	l.peers.Store(1)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// Fallback reports whether the Limiter is pacing in process because Redis
// failed and has not answered since.
func (l *Limiter) Fallback() bool {
	return l.rdb == nil || l.down.Load()
}

// Close stops the goroutines the Limiter started and waits for them: the
// parking listener, the worker goroutines (one busy with a call to a
// client without ContextTimeoutEnabled ends with the client's read
// timeout) and a hand-over of parkings. It does not close rdb, which the
// caller owns. Calls after Close return ErrClosed. Close is safe to call
// more than once, and always returns nil.
func (l *Limiter) Close() error {
	l.mu.Lock()
	if l.closed.Swap(true) {
		l.mu.Unlock()
		return nil
	}
	l.cancel()
	if l.ps != nil {
		l.ps.Close() // ends a read the listener is blocked in
	}
	l.mu.Unlock()
	l.wg.Wait()
	return nil
}

// spawn runs f on a goroutine that Close waits for, unless the Limiter is
// closed; it reports whether it did.
func (l *Limiter) spawn(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed.Load() {
		return false
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
	return true
}

// Reserve takes one slot for a.Host at a.Pace, or at the pace learned for
// the host when slower, shared with every process that uses the same Redis
// and prefix, unless the host is parked or the slot would come after
// a.Latest. Parking and slot are settled by one script, in one round trip.
// A check after the wait for a slot (a.CheckOnly) is answered in process
// while the parking subscription delivers. When Redis is away, the slot is
// taken in process instead and the error is not returned: only the end of
// ctx, an answer from Redis that waiting will not cure (a *RefusedError),
// and ErrClosed are.
func (l *Limiter) Reserve(ctx context.Context, a retryhttp.Attempt) (retryhttp.Reservation, error) {
	if l.closed.Load() {
		return retryhttp.Reservation{}, ErrClosed
	}
	if until, ok := l.mem.parkedUntil(a.Host, a.Now); ok {
		return retryhttp.Reservation{ParkedUntil: until}, nil
	}
	if a.CheckOnly {
		// A parking set elsewhere since this host's last answer would have
		// come through the subscription, if it delivered all along.
		if l.rdb == nil || l.down.Load() {
			return retryhttp.Reservation{OK: true}, nil
		}
		if g := l.sub.Load(); g > 0 && l.mem.subGen(a.Host) == g {
			return retryhttp.Reservation{OK: true}, nil
		}
		a.Pace = retryhttp.Pace{} // the parking alone: no slot
	}
	if !l.useRedis() {
		if a.CheckOnly {
			return retryhttp.Reservation{OK: true}, nil
		}
		return l.mem.reserve(a, a.Pace, l.shares()), nil
	}
	call := ctx
	if a.CheckOnly {
		// The request's slot has come: a check that takes longer than a
		// moment would send it late, onto the next one's slot. A check
		// that does not answer in time is taken to have found nothing.
		var cancel context.CancelFunc
		call, cancel = context.WithTimeout(ctx, min(l.timeout, checkTimeout))
		defer cancel()
	}
	start := time.Now()
	res, err := l.run(call, reserveScript, l.prefix+a.Host, l.reserveArgs(a)...)
	if err == nil && len(res) < 9 {
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
		if permanent(err) {
			return retryhttp.Reservation{}, &RefusedError{Op: "reserve", Key: l.prefix + a.Host, Err: err}
		}
		if a.CheckOnly {
			return retryhttp.Reservation{OK: true}, nil
		}
		l.fail(err)
		return l.local(a, elapsed), nil
	}
	l.answered()
	return l.reservation(a, res, elapsed), nil
}

// reserveArgs are the reserve script's arguments for a: the pace, the
// latest moment a slot may take, how far ahead this process handed out
// slots in process, the mode, and this process's id when its heartbeat
// is due.
func (l *Limiter) reserveArgs(a retryhttp.Attempt) []any {
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
			bound = strconv.FormatInt(us(d), 10)
		} else {
			bound = "-1" // no slot is early enough, not even one now
		}
	}
	ahead, mode, id := "", "", ""
	if a.CheckOnly {
		mode = "c"
	} else {
		// Slots the in-process pacer handed out and still to come.
		if d := l.mem.horizon(a.Host, a.Now); d > 0 {
			ahead = strconv.FormatInt(us(min(d, aheadFloor)), 10)
		}
		if l.down.Load() || l.returning() {
			mode = "r" // a probe, or just back from an outage
		}
		if l.mem.beatDue(a.Host, a.Now) {
			id = l.id
		}
	}
	return []any{us(interval), burst, bound, ahead, mode, id, us(l.probe + 2*l.timeout)}
}

// reservation reads the reserve script's answer, which arrived elapsed
// after a.Now, into a Reservation, and keeps what it says of the host.
func (l *Limiter) reservation(a retryhttp.Attempt, res []int64, elapsed time.Duration) retryhttp.Reservation {
	at := a.Now.Add(elapsed)
	d := time.Duration(res[1]) * time.Microsecond
	if n := int(res[4]); n > 0 {
		l.peers.Store(int64(n))
	}
	l.mem.heard(a.Host, answer{at: at, lead: time.Duration(res[3]) * time.Microsecond,
		n: int(res[4]), rank: int(res[5]), rate: float64(res[6]) / 1e6, burst: int(res[7]),
		sub: l.sub.Load(), lane: res[0] == codeLane})
	switch res[0] {
	case codeParked:
		until := at.Add(d)
		l.mem.park(a.Host, until) // no need to ask Redis again before then
		return retryhttp.Reservation{ParkedUntil: until}
	case codeLate:
		return retryhttp.Reservation{Delay: elapsed + d}
	case codeAskAgain:
		return retryhttp.Reservation{AskAgain: at.Add(d)}
	case codeLane:
		// Processes are coming back from an outage: each paces its share
		// in process a little longer, so that those not back yet and
		// those back do not both take the whole pace.
		return l.local(a, elapsed)
	}
	if d == 0 {
		// The slot is Redis's now, already past: go at once.
		return retryhttp.Reservation{OK: true}
	}
	r := retryhttp.Reservation{OK: true, Delay: elapsed + d}
	if res[2] > 0 && res[8] > 0 {
		key, mine, step := l.prefix+a.Host, res[2], res[8]
		r.Cancel = func(time.Time) { l.cancelSlot(key, mine, step) }
	}
	return r
}

// cancelSlot gives back a slot that a request, cancelled while it waited,
// will not use, if no later slot was taken; see cancelScript. A failure
// leaves the slot taken, which slows the others by one slot at most.
func (l *Limiter) cancelSlot(key string, mine, interval int64) {
	if l.closed.Load() || !l.useRedis() {
		return
	}
	if _, err := l.run(context.Background(), cancelScript, key, mine, interval); err != nil {
		if !permanent(err) {
			l.fail(err)
		}
		return
	}
	l.answered()
}

// Park closes host to every process until the given moment; a moment
// earlier than an existing parking does not shorten it. The parking holds
// in this process at once, and in Redis for the rest of its length, counted
// on Redis's clock; the processes listening hear of it at once. When Redis
// is away, the parking holds in this process and is handed to Redis when it
// answers again; no error is returned. An answer from Redis that waiting
// will not cure is returned as a *RefusedError, after the parking was
// recorded in process.
func (l *Limiter) Park(ctx context.Context, host string, until time.Time) error {
	if l.closed.Load() {
		return ErrClosed
	}
	l.mem.park(host, until)
	rest := time.Until(until)
	if rest <= 0 || !l.useRedis() {
		return nil
	}
	// The parking matters to every process, not only to the request that
	// learnt of it: it is recorded even if that request is cancelled.
	if err := l.parkRedis(context.WithoutCancel(ctx), host, rest); err != nil {
		if permanent(err) {
			return &RefusedError{Op: "park", Key: l.prefix + host, Err: err}
		}
		l.fail(err)
		return nil
	}
	l.answered()
	return nil
}

func (l *Limiter) parkRedis(ctx context.Context, host string, rest time.Duration) error {
	_, err := l.run(ctx, parkScript, l.prefix+host, us(rest+time.Microsecond-1), l.channel, host)
	return err
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

// errorsIsTimeout reports whether err is a timeout of the network or of a
// deadline.
func errorsIsTimeout(err error) bool {
	var nerr interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout())
}
