package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// ErrHostPaused is the errors.Is target for a request that failed at once
// because its host is parked: a server asked for a wait longer than the
// Transport's Retry-After max, or longer than the request's context allows.
var ErrHostPaused = errors.New("retryhttp: host paused")

// HostPausedError is the detail behind ErrHostPaused: which host, and until
// when. errors.Is(err, ErrHostPaused) reports true for it.
type HostPausedError struct {
	Host  string
	Until time.Time
}

// Error names the host and the moment it reopens.
func (e *HostPausedError) Error() string {
	return fmt.Sprintf("retryhttp: host %s paused until %s", e.Host, e.Until.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrHostPaused.
func (e *HostPausedError) Unwrap() error { return ErrHostPaused }

// Pace is a per-host rate: Limit attempts a second on average, Burst of them
// at once. A Limit of zero, rate.Inf, negative or NaN means no pace.
type Pace struct {
	Limit rate.Limit
	Burst int
}

// Unlimited reports whether p paces nothing.
func (p Pace) Unlimited() bool {
	return !(p.Limit > 0) || p.Limit == rate.Inf
}

// min is the slower of two paces, burst and rate each.
func (p Pace) min(q Pace) Pace {
	switch {
	case q.Unlimited():
		return p
	case p.Unlimited():
		return q
	}
	return Pace{Limit: min(p.Limit, q.Limit), Burst: min(p.Burst, q.Burst)}
}

// interval is the time between two slots; newPace keeps it within an hour.
func (p Pace) interval() time.Duration {
	return time.Duration(float64(time.Second) / float64(p.Limit))
}

// Attempt is what a Transport asks a Limiter before each try to a host.
type Attempt struct {
	Host   string    // host[:port], lower case, without the scheme's default port
	Pace   Pace      // the pace configured for Host; the Limiter may pace slower, never faster
	Now    time.Time // the Transport's clock
	Latest time.Time // the attempt must start by then (the request's deadline); zero: no bound
	// CheckOnly asks whether the host is parked, taking no slot: the
	// attempt already has one, and waited for it.
	CheckOnly bool
}

// Reservation is a Limiter's answer.
type Reservation struct {
	// OK is true when a slot was taken: the attempt starts after Delay.
	OK bool
	// Delay is the wait from Attempt.Now until the slot.
	Delay time.Duration
	// ParkedUntil is non-zero when the host is parked: nothing was taken,
	// and the caller may ask again once it has waited until then.
	ParkedUntil time.Time
	// AskAgain is non-zero when nothing was taken because the host's
	// slots are handed out no further ahead than a short horizon (its pace
	// is learned, and may change): the caller waits until then and asks
	// again.
	AskAgain time.Time
	// Cancel, when non-nil, gives the slot back: the Transport calls it
	// when the request's context ends before the slot comes, so that a
	// cancelled request does not hold up the ones behind it.
	Cancel func(now time.Time)
}

// Signal is what an answer from a host says of its capacity; the
// Transport gives it to Limiter.Learn. The zero Signal (but for Now) says
// nothing, and asks for the host's pace.
type Signal struct {
	Now time.Time
	// Refused is set for an answer that says the host is over its
	// capacity: a 429, or a 503 that names no wait.
	Refused bool
	// Status is the answer's status.
	Status int
	// Wait is the wait a refusal named (a 429's Retry-After): the host
	// takes at least one request per Wait.
	Wait time.Duration
	// Limit is the quota the host announces (X-RateLimit-Limit,
	// RateLimit-Policy), 0 when none; Window the time it is granted over
	// when the host says so (RateLimit-Policy's w), else 0; Reset the time
	// until the quota is whole again (X-RateLimit-Reset as a delay), -1
	// when not said; Remaining what is left of it, -1 when not said.
	Limit     int
	Window    time.Duration
	Reset     time.Duration
	Remaining int
	// Sent is how many attempts the process sent in the last second, to
	// every host: a bound on what this host got before the Limiter kept
	// count of it.
	Sent float64
}

// Limiter paces attempts per host, holds each host's parking and learns
// each host's capacity. The Transport asks it before every attempt, tells it
// of every parking and of every answer that says something of the host's
// capacity. The default is an in-process limiter owned by the Transport;
// WithLimiter installs another, such as redislimit's, which shares them
// across processes. A Limiter must be safe for concurrent use and must not
// block beyond ctx.
type Limiter interface {
	// Reserve takes one attempt's slot to a.Host at a.Pace or slower (a
	// learned pace), unless the host is parked (ParkedUntil set, nothing
	// taken) or the slot would come after a.Latest (OK false, nothing
	// taken). An error means the limiter itself failed; the Transport
	// returns it without sending.
	Reserve(ctx context.Context, a Attempt) (Reservation, error)
	// Park closes host to every caller until the given moment. A moment
	// earlier than an existing parking does not shorten it.
	Park(ctx context.Context, host string, until time.Time) error
	// Learn records what an answer from host says of its capacity and
	// returns the pace learned for it, unlimited when none. A Limiter that
	// learns nothing returns an unlimited Pace.
	Learn(ctx context.Context, host string, s Signal) (Pace, error)
}

// localLimiter is the default Limiter. Hosts live in shards, so unrelated
// hosts never wait on one lock; a request to an unpaced host while nothing is
// parked or learned touches no lock at all.
type localLimiter struct {
	// parkedUntil is the end of the latest parking ever set, as monotonic
	// nanoseconds since epoch: while now is past it, no host is parked.
	parkedUntil atomic.Int64
	// learning counts the hosts with a capacity being learned: while it is
	// zero, no host is paced but by configuration, and none needs counting.
	learning atomic.Int64
	epoch    time.Time
	clock    Clock        // for Park, which is told no time but must sweep by it
	logger   *slog.Logger // one line when a host's learned pace changes much
	shards   [shardCount]shard
}

const shardCount = 64

type shard struct {
	mu      sync.Mutex
	hosts   map[string]*hostState
	sweepAt int // sweep idle hosts when the map reaches this size
	_       [40]byte
}

// hostState is what one host costs: under 100 bytes with its map entry,
// and what it has learned when it refused or announced a quota.
type hostState struct {
	tat   time.Time // the pace's theoretical arrival time (GCRA): the slot after the last one given
	until time.Time // parked until; zero or past: not parked
	cap   *capacity // nil until the host refuses or announces a quota
}

// minSweep is the map size below which a shard is never swept.
const minSweep = 64

func newLocalLimiter(clk Clock) *localLimiter {
	return &localLimiter{clock: clk, epoch: clk.Now()}
}

// quiet reports, with two atomic loads, that no host is parked at now nor
// paced by what was learned.
func (l *localLimiter) quiet(now time.Time) bool {
	return l.learning.Load() == 0 && now.Sub(l.epoch).Nanoseconds() >= l.parkedUntil.Load()
}

func (l *localLimiter) Reserve(_ context.Context, a Attempt) (Reservation, error) {
	if a.Pace.Unlimited() && l.quiet(a.Now) {
		return Reservation{OK: true}, nil
	}
	s := &l.shards[shardOf(a.Host)]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.hosts[a.Host]
	if st == nil {
		if a.Pace.Unlimited() {
			return Reservation{OK: true}, nil // not parked: parking creates the entry
		}
		st = s.add(l, a.Host, a.Now)
	}
	if st.until.After(a.Now) {
		return Reservation{ParkedUntil: st.until}, nil
	}
	if a.CheckOnly {
		return Reservation{OK: true}, nil
	}
	pace := l.paceOf(a.Host, st, a.Pace, a.Now)
	if pace.Unlimited() {
		st.count(a.Now)
		return Reservation{OK: true}, nil
	}
	// A learned pace may grow while requests wait: slots are then handed
	// out no further than learnHorizon ahead, so that those waiting get the
	// faster pace when it comes.
	horizon := time.Duration(0)
	if pace != a.Pace {
		horizon = learnHorizon
	}
	delay, ok := st.take(a.Now, pace, a.Latest, horizon)
	if st.cap != nil && delay >= pace.interval() {
		st.cap.busyAt = a.Now // a request is queued behind another: the pace binds
	}
	if !ok {
		if horizon > 0 && delay > horizon && (a.Latest.IsZero() || !a.Now.Add(delay).After(a.Latest)) {
			return Reservation{AskAgain: a.Now.Add(delay - horizon)}, nil
		}
		return Reservation{Delay: delay}, nil
	}
	st.count(a.Now)
	res := Reservation{OK: true, Delay: delay}
	if delay > 0 {
		interval := pace.interval()
		res.Cancel = func(now time.Time) {
			s.mu.Lock()
			defer s.mu.Unlock()
			st.giveBack(now, interval)
		}
	}
	return res, nil
}

// take gives the next slot at pace p: the generic cell rate algorithm,
// which is a token bucket of p.Burst refilled at p.Limit, kept as one time.
// Nothing is taken either when horizon is set and the slot is further away.
// The slot comes no earlier than the end of the host's last parking, and
// with no burst right after it, so a reopened host is not stormed. ok is
// false, and nothing is taken, when the slot would come after latest.
func (st *hostState) take(now time.Time, p Pace, latest time.Time, horizon time.Duration) (time.Duration, bool) {
	interval := p.interval()
	tolerance := time.Duration(p.Burst-1) * interval
	tat := st.tat
	if tat.Before(now) {
		tat = now
	}
	if floor := st.until.Add(tolerance); tat.Before(floor) {
		tat = floor
	}
	slot := tat.Add(-tolerance)
	if slot.Before(now) {
		slot = now
	}
	delay := slot.Sub(now)
	if (!latest.IsZero() && slot.After(latest)) || (horizon > 0 && delay > horizon) {
		return delay, false
	}
	st.tat = tat.Add(interval)
	return delay, true
}

// giveBack returns a slot taken and not used, when it can still serve.
func (st *hostState) giveBack(now time.Time, interval time.Duration) {
	if back := st.tat.Add(-interval); !back.Before(now) {
		st.tat = back
	}
}

// count tells the host's capacity, if it learns one, of an attempt sent.
func (st *hostState) count(now time.Time) {
	if st.cap != nil {
		st.cap.sent.add(now, 1)
		st.cap.pending++
	}
}

func (l *localLimiter) Park(_ context.Context, host string, until time.Time) error {
	s := &l.shards[shardOf(host)]
	s.mu.Lock()
	st := s.hosts[host]
	if st == nil {
		st = s.add(l, host, l.clock.Now())
	}
	if until.After(st.until) {
		st.until = until
	}
	s.mu.Unlock()
	for n := until.Sub(l.epoch).Nanoseconds(); ; {
		cur := l.parkedUntil.Load()
		if n <= cur || l.parkedUntil.CompareAndSwap(cur, n) {
			return nil
		}
	}
}

// add makes a host's entry, first dropping idle hosts when the shard has
// grown: a host whose bucket is full again, whose parking is over and whose
// learned capacity has expired is indistinguishable from a new one, so
// forgetting it changes nothing. The sweep runs when the shard doubles, so
// its cost is constant per host added and a crawler of a million hosts
// holds only those active lately.
func (s *shard) add(l *localLimiter, host string, now time.Time) *hostState {
	if s.hosts == nil {
		s.hosts = make(map[string]*hostState)
		s.sweepAt = minSweep
	}
	if len(s.hosts) >= s.sweepAt {
		for h, st := range s.hosts {
			if st.idle(now) {
				if st.cap != nil {
					l.learning.Add(-1)
				}
				delete(s.hosts, h)
			}
		}
		s.sweepAt = max(minSweep, 2*len(s.hosts))
	}
	st := &hostState{}
	s.hosts[host] = st
	return st
}

// idle reports whether a host can be forgotten when its shard grows: not
// parked, its bucket full, and what it taught either expired or, under this
// pressure of memory, not used for learnIdle.
func (st *hostState) idle(now time.Time) bool {
	return !st.until.After(now) && !st.tat.After(now) &&
		(st.cap == nil || st.cap.expired(now) || now.Sub(st.cap.seen) >= learnIdle)
}

// shardOf is FNV-1a, inlined so that hashing a host allocates nothing.
func shardOf(host string) int {
	h := uint32(2166136261)
	for i := 0; i < len(host); i++ {
		h ^= uint32(host[i])
		h *= 16777619
	}
	return int(h % shardCount)
}

// hostKey names the host an attempt goes to as net/http would dial it:
// lower case, without the scheme's default port or an empty one, without
// the trailing dot of a fully qualified name, and an internationalised name
// in its ASCII (punycode) form. It allocates only for a host that needs one
// of these changes.
func hostKey(u *url.URL) string {
	if u == nil {
		return ""
	}
	return canonicalHost(u.Scheme, u.Host)
}

func canonicalHost(scheme, h string) string {
	name, port := splitHostPort(h)
	if port == "" || (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		h, port = name, ""
	}
	if plainHost(name) && port == "" {
		return h
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if !isASCII(name) {
		name = toPunycode(name)
	}
	if port != "" {
		return name + ":" + port
	}
	return name
}

// splitHostPort splits host[:port], keeping an IPv6 literal's brackets.
func splitHostPort(h string) (name, port string) {
	i := strings.LastIndexByte(h, ':')
	if i < 0 || strings.LastIndexByte(h, ']') > i {
		return h, ""
	}
	return h[:i], h[i+1:]
}

// plainHost reports whether name is already canonical: lower-case ASCII,
// no trailing dot.
func plainHost(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 0x80 || ('A' <= c && c <= 'Z') {
			return false
		}
	}
	return !strings.HasSuffix(name, ".")
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// normalizeHostOption accepts what a user may pass to WithHostPace: a bare
// host, host:port, an IPv6 address with or without brackets, or a URL.
func normalizeHostOption(host string) string {
	host = strings.TrimSpace(host)
	if strings.Contains(host, "://") {
		if u, err := url.Parse(host); err == nil {
			return hostKey(u)
		}
	}
	if strings.Count(host, ":") > 1 && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]" // a bare IPv6 address, as a URL writes it
	}
	name, port := splitHostPort(host)
	if port == "443" || port == "80" {
		host = name
	}
	return canonicalHost("", host)
}

// paceError is a Transport's pace declining an attempt: its slot to the
// host comes after the request's deadline. It matches
// context.DeadlineExceeded, and an outer Transport never retries it.
type paceError struct {
	host string
	wait time.Duration
}

func (e *paceError) Error() string {
	return fmt.Sprintf("retryhttp: pacing %s needs a wait of %v, past the request's deadline", e.host, e.wait)
}

func (e *paceError) Unwrap() error { return context.DeadlineExceeded }

// admit waits until an attempt to host may start, and returns when it
// started: out the host's parking, if it fits the max wait and the
// deadline, then for the pace's slot. A parking set while it waits for the
// slot is waited out too, and the slot taken afresh behind it: no round
// limit, since every parking it waits out was named by a server and fits
// the bounds, and the deadline ends the rest. It returns a
// *HostPausedError when a parking does not fit, a *paceError when the slot
// would come after the deadline, and the context's error when it ends the
// wait.
//
// now is the caller's reading of the clock: the success path reads it once
// per request, which matters where reading it costs 100 ns.
func (t *Transport) admit(ctx context.Context, host string, now time.Time) (time.Time, error) {
	deadline, _ := ctx.Deadline()
	a := Attempt{Host: host, Pace: t.paceFor(host), Latest: deadline}
	for {
		a.Now = now
		res, err := t.limiter.Reserve(ctx, a)
		if err != nil {
			return now, err
		}
		if res.OK {
			if res.Delay <= 0 {
				return now, nil
			}
			// Delay counts from now, and the limiter may have taken a
			// while to answer (a round trip to Redis): sleep until the
			// slot, not for Delay from here, or the attempt goes late and
			// bunches with the next one.
			slot := now.Add(res.Delay)
			if err := t.clock.Sleep(ctx, slot.Sub(t.clock.Now())); err != nil {
				if res.Cancel != nil {
					res.Cancel(t.clock.Now())
				}
				return now, err
			}
			now = t.clock.Now()
			// Another request's answer may have parked the host while
			// this one waited: look again, taking no second slot.
			until, err := t.parkedUntil(ctx, host, now)
			if err != nil || until.IsZero() {
				return now, err
			}
			if err := t.waitParking(ctx, host, now, until, deadline); err != nil {
				return now, err
			}
			now = t.clock.Now()
			continue
		}
		if !res.AskAgain.IsZero() {
			if err := t.clock.Sleep(ctx, res.AskAgain.Sub(now)); err != nil {
				return now, err
			}
			now = t.clock.Now()
			continue
		}
		if res.ParkedUntil.IsZero() {
			return now, &paceError{host: host, wait: res.Delay}
		}
		if err := t.waitParking(ctx, host, now, res.ParkedUntil, deadline); err != nil {
			return now, err
		}
		now = t.clock.Now()
	}
}

// parkedUntil asks the limiter whether host is parked, taking no slot.
func (t *Transport) parkedUntil(ctx context.Context, host string, now time.Time) (time.Time, error) {
	res, err := t.limiter.Reserve(ctx, Attempt{Host: host, Pace: Pace{Limit: rate.Inf}, Now: now, CheckOnly: true})
	return res.ParkedUntil, err
}

// waitParking waits until a parking ends, if that fits the max wait and the
// deadline.
func (t *Transport) waitParking(ctx context.Context, host string, now, until, deadline time.Time) error {
	if until.Sub(now) > t.raMax || (!deadline.IsZero() && until.After(deadline)) {
		return &HostPausedError{Host: host, Until: until}
	}
	return t.clock.Sleep(ctx, until.Sub(now))
}

// admitted reports, without asking the limiter, that an attempt made at now
// may start at once: the in-process limiter paces no host and none is
// parked. It is the success path's admit, and needs no host name.
func (t *Transport) admitted(now time.Time) bool {
	return t.free != nil && t.free.quiet(now)
}

// paceFor returns the pace configured for host: its own, else the default.
func (t *Transport) paceFor(host string) Pace {
	if p, ok := t.hostPace[host]; ok {
		return p
	}
	return t.pace
}

// park tells the limiter that host asked for a wait of d from now, and
// returns when the parking ends. The parking is bounded by MaxParking
// whatever the server said.
func (t *Transport) park(ctx context.Context, host string, now time.Time, d time.Duration) time.Time {
	until := now.Add(min(d, MaxParking))
	if err := t.limiter.Park(ctx, host, until); err != nil && t.logger != nil {
		t.logger.LogAttrs(ctx, slog.LevelWarn, "retryhttp: parking failed",
			slog.String("host", host), slog.String("error", err.Error()))
	}
	return until
}

// HostPace returns the pace in force for host (a host name, host:port or
// URL, as WithHostPace takes): the configured one, or slower when the
// Transport has learned the host takes less. An unlimited Pace means the
// host is not paced. For logs and metrics.
func (t *Transport) HostPace(ctx context.Context, host string) (Pace, error) {
	host = normalizeHostOption(host)
	configured := t.paceFor(host)
	learned, err := t.limiter.Learn(ctx, host, Signal{Now: t.clock.Now(), Reset: -1, Remaining: -1})
	if err != nil {
		return configured, err
	}
	return configured.min(learned), nil
}
