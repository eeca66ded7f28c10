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
// the Limiter paces in process instead, each process at the share of the
// pace its claim in Redis holds, logs one warning, and goes back to Redis
// once it answers again. Through a partition that cuts some processes off,
// a loss of Redis's data or a Ring shard lost, the host sees at most one
// burst above the pace across all processes (see the README).
package redislimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
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
// Redis starts one that listens for parkings and a short-lived one that
// reads Redis's eviction policy; a keeper runs while the process holds a
// claim on a host or a parking (it gives back the claims of hosts the
// process stopped calling, and puts back parkings Redis lost); a client
// without ContextTimeoutEnabled is called from worker goroutines started
// when needed, which leave after 10 s idle. Close stops them all.
type Limiter struct {
	rdb     redis.UniversalClient
	prefix  string
	channel string // where parkings are published; "" when they are not
	// publish: parkings are published by the Limiter after the park
	// script, on the channel's shard of a Ring, rather than by the script
	// on the host's shard, where no one listens.
	publish bool
	id      string // this Limiter among the processes sharing a host
	idArg   any    // id, boxed once for the scripts' arguments
	timeout time.Duration
	probe   time.Duration
	logger  *slog.Logger
	share   int
	win     any  // how long processes get to come back after a loss, µs, boxed once
	direct  bool // the client bounds its calls by the context's deadline
	// stale: calls carry a bound on the server's clock past which they
	// are refused (not with a Cluster, whose nodes' clocks differ).
	stale   bool
	mem     memory
	free    freeHosts // hosts with no pace that need nothing (see free.go)
	start   time.Time // origin of the clock readings below
	servers []*server // one, or a Ring's shards; none for a Cluster
	// A Cluster's servers, one per hash slot (see cluster.go).
	cluster  *redis.ClusterClient
	slots    *[clusterSlots]atomic.Pointer[server]
	slotMu   sync.Mutex
	failing  map[*server]struct{} // the slots failing, guarded by slotMu
	watching atomic.Bool          // watchSlots runs
	shards   shardClients

	warnedAt atomic.Int64 // the last warning, in ns since start
	unsaid   atomic.Bool  // a warning was logged and its recovery not yet
	started  atomic.Bool  // the listener and the policy check were started
	keeping  atomic.Bool  // the keeper runs (see keep)
	peers    atomic.Int64 // claims at the last answer that counted them, any host
	// sub is the parking subscription's generation: positive while it is
	// known to be delivering, a new value each time it (re)subscribes.
	sub atomic.Int64

	calls   chan *call   // to idle workers; see run
	workers atomic.Int32 // workers running

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	closed atomic.Bool
	mu     sync.Mutex     // guards wg.Add against Close
	wg     sync.WaitGroup // the goroutines Close waits for
	// psMu guards ps against Close. Not mu: subscribing takes round
	// trips, and spawn, on requests' path, must not wait for them.
	psMu sync.Mutex
	ps   *redis.PubSub
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
// process takes the share its claim on the host holds in Redis: 1/n of the
// processes using the host, or what the others leave one that joins them,
// so n needs no setting; and a process that holds no claim on the host (it
// never reached Redis for it) waits for Redis rather than guess. Set it
// only to hold a share fixed whatever Redis counted, say 1 for a process
// that must never slow down nor wait in an outage: the bound on the pace
// across processes then rests on n being right.
func WithFallbackShare(n int) Option {
	return func(l *Limiter) { l.share = n }
}

// New returns a Limiter that keeps its state in rdb, which may be a
// *redis.Client, a *redis.ClusterClient (each host is a single key, so every
// script runs on one slot; each slot fails and comes back on its own, and
// while one fails the Limiter has go-redis reload the slot map, so that a
// replica promoted is used at once), a failover client or a *redis.Ring. With a Ring
// the Limiter places each host on one of the shards the Ring was made with
// (RingOptions.Addrs) itself, and calls that shard's client: a dead shard is
// then an outage for its hosts, not a move to a shard that knows nothing of
// them. A nil rdb makes a Limiter that always paces in process. New does
// not call Redis: call Check to find a misconfigured Redis at start.
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
	// Two probe intervals, not one: a process whose first probe after a
	// loss fails (a server still starting, a loaded machine, a probe that
	// times out) comes back at its second, and with one interval the
	// others had gone back to the whole bucket meanwhile while it paced its
	// share in process: TestRingShardBackEmpty, four at once on two cores,
	// went over the pace in 6 runs of 32 with one interval, none with two.
	l.win = us(2*l.probe + 2*l.timeout)
	l.direct = contextAware(rdb)
	l.servers = newServers(rdb, l.prefix)
	switch c := rdb.(type) {
	case *redis.Client:
		l.channel, l.stale = l.prefix+"parked", true
	case *redis.ClusterClient:
		l.channel = l.prefix + "parked"
		l.cluster, l.slots, l.failing = c, new([clusterSlots]atomic.Pointer[server]), make(map[*server]struct{})
	case *redis.Ring:
		l.channel, l.publish, l.stale = l.prefix+"parked", true, true
	}
	// The start time first, so that ids sort by it (see reserveLua).
	var b [6]byte
	rand.Read(b[:])
	l.id = fmt.Sprintf("%016x", l.start.UnixMicro()) + hex.EncodeToString(b[:])
	l.idArg = l.id
	l.warnedAt.Store(math.MinInt64 / 2)
	l.peers.Store(1)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// Fallback reports whether the Limiter is pacing in process because Redis
// (with a Ring, one of its shards) failed and has not answered since.
func (l *Limiter) Fallback() bool {
	if l.rdb == nil {
		return true
	}
	for _, s := range l.servers {
		if s.down.Load() {
			return true
		}
	}
	if l.slots != nil {
		l.slotMu.Lock()
		defer l.slotMu.Unlock()
		for s := range l.failing {
			if s.down.Load() {
				return true
			}
		}
	}
	return false
}

// Close stops the goroutines the Limiter started and waits for them: the
// parking listener, the worker goroutines (one busy with a call to a
// client without ContextTimeoutEnabled ends with the client's read
// timeout) and a hand-over of parkings. It does not close rdb, which the
// caller owns. Calls after Close return ErrClosed. Close is safe to call
// more than once, and always returns nil.
func (l *Limiter) Close() error {
	if l.closed.Load() {
		return nil
	}
	l.leaveAll()
	l.mu.Lock()
	if l.closed.Swap(true) {
		l.mu.Unlock()
		return nil
	}
	l.cancel()
	l.mu.Unlock()
	l.psMu.Lock()
	if l.ps != nil {
		l.ps.Close() // ends a read the listener is blocked in
	}
	l.psMu.Unlock()
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
// taken in process instead, at this process's share of the pace, and the
// error is not returned: only the end of ctx, an answer from Redis that
// waiting will not cure (a *RefusedError), and ErrClosed are. A process
// that holds no share of the host (it never reached Redis for it, or gave
// its share back) waits for Redis, asking again at its next probe.
func (l *Limiter) Reserve(ctx context.Context, a retryhttp.Attempt) (retryhttp.Reservation, error) {
	if l.closed.Load() {
		return retryhttp.Reservation{}, ErrClosed
	}
	if until, ok := l.mem.parkedUntil(a.Host, a.Now); ok {
		return retryhttp.Reservation{ParkedUntil: until}, nil
	}
	srv := l.serverFor(a.Host)
	if a.CheckOnly {
		return l.check(ctx, srv, a)
	}
	if l.rdb != nil && !srv.down.Load() {
		// Back from pacing in process: the slots handed out there are
		// this process's share, still counted as away; a slot from Redis
		// comes once they have passed, not among them.
		if own, ok := l.mem.pending(a.Host, a.Now); ok {
			if !a.Latest.IsZero() && own.After(a.Latest) {
				return retryhttp.Reservation{Delay: own.Sub(a.Now)}, nil
			}
			return retryhttp.Reservation{AskAgain: own}, nil
		}
	}
	if a.Pace.Unlimited() && l.rdb != nil && !srv.down.Load() && l.freeReserve(srv, a) {
		return retryhttp.Reservation{OK: true}, nil
	}
	if !l.useRedis(srv) {
		return l.local(srv, a, 0), nil
	}
	res, elapsed, err := l.reserveRedis(ctx, srv, a)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return retryhttp.Reservation{}, cerr
		}
		if permanent(err) {
			return retryhttp.Reservation{}, &RefusedError{Op: "reserve", Key: l.prefix + a.Host, Err: err}
		}
		l.fail(srv, err)
		return l.local(srv, a, elapsed), nil
	}
	l.answeredFor(srv, a.Host)
	if res[0] == codeProbed {
		// Redis is back: ask again as a process that is back, once the
		// slots it handed out in process have passed.
		a.Now = a.Now.Add(elapsed)
		return l.Reserve(ctx, a)
	}
	if a.Pace.Unlimited() {
		l.heardFree(a.Host, res)
	}
	return l.reservation(srv, a, res, elapsed), nil
}

// check answers the check for a parking after a request's wait for its
// slot. A parking set elsewhere since the host's last answer would have
// come through the subscription, if it delivered all along; else Redis
// is asked, within a moment: the request's slot has come, and a check
// that took longer would send it late, onto the next one's slot. A check
// that does not answer in time is taken to have found nothing.
func (l *Limiter) check(ctx context.Context, srv *server, a retryhttp.Attempt) (retryhttp.Reservation, error) {
	ok := retryhttp.Reservation{OK: true}
	if l.rdb == nil || srv.down.Load() {
		return ok, nil
	}
	if g := l.sub.Load(); g > 0 && l.mem.subGen(a.Host) == g {
		return ok, nil
	}
	a.Pace = retryhttp.Pace{} // the parking alone: no slot
	call, cancel := context.WithTimeout(ctx, min(l.timeout, checkTimeout))
	defer cancel()
	res, elapsed, err := l.reserveRedis(call, srv, a)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return retryhttp.Reservation{}, cerr
		}
		if permanent(err) {
			return retryhttp.Reservation{}, &RefusedError{Op: "reserve", Key: l.prefix + a.Host, Err: err}
		}
		return ok, nil
	}
	l.answered(srv)
	return l.reservation(srv, a, res, elapsed), nil
}

// errStale is a call refused twice as stale though answered in time: the
// server's clock moves in a way the estimate cannot follow.
var errStale = errors.New("redislimit: the server's clock disagrees with its answers")

// reserveRedis runs the reserve script for a on srv, and returns its
// answer and how long after a.Now it came. A call the script refused as
// stale though its answer came in time tells that the estimate of the
// server's clock was off: it is corrected, and the call made again. A
// call that failed may still run later: the moment until which it could
// renew this process's claim is recorded, for the in-process pacer to
// start no earlier.
func (l *Limiter) reserveRedis(ctx context.Context, srv *server, a retryhttp.Attempt) ([]int64, time.Duration, error) {
	var p prep
	if !a.CheckOnly {
		p = l.mem.prepare(a.Host, l.prefix, a.Now, !a.Pace.Unlimited(), l.stale)
	}
	start := time.Now()
	key := p.key
	if key == nil {
		key = l.prefix + a.Host // a check, or a host new to the process
	}
	for try := 0; ; try++ {
		// A probe renews no claim, however late it runs, and takes no
		// slot: its process paces the host in process meanwhile. A host
		// with no share to pace so waits for Redis, and its call while
		// Redis fails is an ordinary one: answered, it has its slot and
		// its claim at once, where a probe answered would need a second
		// call, on a link that may answer one call in two.
		probe := srv.down.Load() && !a.CheckOnly && (l.share > 0 || ((p.knew || p.had) && p.share > 0))
		sent, sentAt := us(time.Since(l.start)), a.Now.Add(time.Since(start))
		rc := newReserveCall(srv, key)
		late := l.reserveArgs(rc, srv, a, p, sent, probe)
		res, err := l.runReserve(ctx, srv, rc)
		elapsed := time.Since(start)
		if err == nil && len(res) < 13 {
			err = errAnswer(res)
		}
		if err != nil {
			// A call that found no connection was never sent.
			if !a.CheckOnly && !probe && !unsent(err) {
				l.mem.unanswered(a.Host, sentAt.Add(late))
			}
			return nil, elapsed, err
		}
		got := us(time.Since(l.start))
		if res[0] == codeStale {
			srv.clock.reset(sent, got, res[11])
			if try == 0 {
				continue
			}
			return nil, elapsed, errStale
		}
		srv.clock.sample(sent, got, res[11])
		l.seenEpoch(srv, res[10])
		return res, elapsed, nil
	}
}

// reservation reads the reserve script's answer, which arrived elapsed
// after a.Now, into a Reservation, and keeps what it says of the host.
func (l *Limiter) reservation(srv *server, a retryhttp.Attempt, res []int64, elapsed time.Duration) retryhttp.Reservation {
	at := a.Now.Add(elapsed)
	d := time.Duration(res[1]) * time.Microsecond
	if n := int(res[4]); n > 0 {
		l.peers.Store(int64(n))
	}
	ans := answer{at: at, lead: time.Duration(res[3]) * time.Microsecond,
		n: int(res[4]), rank: int(res[5]), rate: float64(res[6]) / 1e6, burst: int(res[7]),
		sub: l.sub.Load(), lane: res[0] == codeLane, check: a.CheckOnly, claim: res[9], redisNow: res[11], share: int(res[12])}
	if ans.lane {
		// The lane ends d after Redis ran the call, which was no earlier
		// than a.Now; a call sent a timeout before that runs in it, or is
		// refused (see bounds).
		ans.laneTo = a.Now.Add(d - l.timeout)
		if e, now := res[10], res[11]; e > 0 && now >= e {
			// When the server's data began, on the Transport's clock: no
			// earlier than that, counted from the answer's arrival.
			ans.began = at.Add(-time.Duration(now-e) * time.Microsecond)
		}
	}
	if l.mem.heard(a.Host, ans) {
		l.keepOn()
	}
	switch res[0] {
	case codeParked:
		until := at.Add(d)
		l.mem.park(a.Host, until) // no need to ask Redis again before then
		l.keepOn()
		return retryhttp.Reservation{ParkedUntil: until}
	case codeLate:
		return retryhttp.Reservation{Delay: elapsed + d}
	case codeAskAgain:
		return retryhttp.Reservation{AskAgain: at.Add(d)}
	case codeDown:
		// Another process's model holds the host down, and has its probe.
		return retryhttp.Reservation{Down: &retryhttp.HostDownError{Host: a.Host, Last: "found down by another process",
			Retry: at.Add(min(d, probeEvery))}}
	case codeLane:
		// Processes are coming back from an outage: each paces its share
		// in process a little longer, so that those not back yet and
		// those back do not both take the whole pace.
		return l.local(srv, a, elapsed)
	}
	if d == 0 {
		// The slot is Redis's now, already past: go at once.
		return retryhttp.Reservation{OK: true}
	}
	l.mem.slot(a.Host, at.Add(d))
	r := retryhttp.Reservation{OK: true, Delay: elapsed + d}
	if res[2] > 0 && res[8] > 0 {
		host, mine, step := a.Host, res[2], res[8]
		r.Cancel = func(time.Time) { l.cancelSlot(srv, host, mine, step) }
	}
	return r
}

// cancelSlot gives back a slot that a request, cancelled while it waited,
// will not use, if no later slot was taken; see cancelScript. A failure
// leaves the slot taken, which slows the others by one slot at most.
func (l *Limiter) cancelSlot(srv *server, host string, mine, interval int64) {
	if l.closed.Load() || !l.useRedis(srv) {
		return
	}
	res, err := l.run(context.Background(), srv, cancelScript, []string{l.prefix + host}, mine, interval)
	if err != nil {
		if !permanent(err) {
			l.fail(srv, err)
		}
		return
	}
	l.answered(srv)
	if len(res) > 0 && res[0] == 1 {
		l.mem.gaveBack(host, time.Duration(interval)*time.Microsecond)
	}
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
	l.keepOn()
	rest := time.Until(until)
	srv := l.serverFor(host)
	if rest <= 0 || !l.useRedis(srv) {
		return nil
	}
	// The parking matters to every process, not only to the request that
	// learnt of it: it is recorded even if that request is cancelled.
	if err := l.parkRedis(context.WithoutCancel(ctx), srv, host, rest); err != nil {
		if permanent(err) {
			return &RefusedError{Op: "park", Key: l.prefix + host, Err: err}
		}
		l.fail(srv, err)
		return nil
	}
	l.answered(srv)
	return nil
}

// parkRedis parks host on srv for rest, and tells the processes listening.
func (l *Limiter) parkRedis(ctx context.Context, srv *server, host string, rest time.Duration) error {
	channel := l.channel
	if l.publish {
		channel = ""
	}
	n := us(rest + time.Microsecond - 1)
	res, err := l.run(ctx, srv, parkScript, []string{l.prefix + host}, n, channel, host)
	if err != nil || !l.publish || len(res) == 0 || res[0] != 1 {
		return err
	}
	// On a Ring, where the channel lives on a shard of its own: a failure
	// to publish leaves the others to find the parking on their next call.
	if c, err := l.client(l.serverFor(l.channel)); err == nil {
		pctx, cancel := context.WithTimeout(ctx, l.timeout)
		defer cancel()
		c.(*redis.Client).Publish(pctx, l.channel, strconv.FormatInt(n, 10)+" "+host)
	}
	return nil
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

// unsent reports whether a call failed for want of a connection: the
// server refused it, or there is no server to call.
func unsent(err error) bool {
	var op *net.OpError
	return errors.Is(err, errShardGone) || (errors.As(err, &op) && op.Op == "dial" && !op.Timeout())
}

// errorsIsTimeout reports whether err is a timeout of the network or of a
// deadline.
func errorsIsTimeout(err error) bool {
	var nerr interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout())
}
