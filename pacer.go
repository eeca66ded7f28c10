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

// Attempt is what a Transport asks a Limiter before each try to a host.
type Attempt struct {
	Host   string    // host[:port], lower case, without the scheme's default port
	Pace   Pace      // the pace configured for Host
	Now    time.Time // the Transport's clock
	Latest time.Time // the attempt must start by then (the request's deadline); zero: no bound
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
	// Cancel, when non-nil, gives the slot back: the Transport calls it
	// when the request's context ends before the slot comes, so that a
	// cancelled request does not hold up the ones behind it.
	Cancel func(now time.Time)
}

// Limiter paces attempts per host and holds each host's parking. The
// Transport asks it before every attempt and tells it of every parking. The
// default is an in-process limiter owned by the Transport; WithLimiter
// installs another, such as redislimit's, which shares both across
// processes. A Limiter must be safe for concurrent use and must not block
// beyond ctx.
type Limiter interface {
	// Reserve takes one attempt's slot to a.Host at a.Pace, unless the host
	// is parked (ParkedUntil set, nothing taken) or the slot would come
	// after a.Latest (OK false, nothing taken). An error means the limiter
	// itself failed; the Transport returns it without sending.
	Reserve(ctx context.Context, a Attempt) (Reservation, error)
	// Park closes host to every caller until the given moment. A moment
	// earlier than an existing parking does not shorten it.
	Park(ctx context.Context, host string, until time.Time) error
}

// localLimiter is the default Limiter. Hosts live in shards, so unrelated
// hosts never wait on one lock; a request to an unpaced host while nothing is
// parked touches no lock at all.
type localLimiter struct {
	// parkedUntil is the latest parking ever set, in Unix nanoseconds: while
	// now is past it, no host is parked and the map need not be consulted.
	parkedUntil atomic.Int64
	clock       Clock // for Park, which is told no time but must sweep by it
	shards      [shardCount]shard
}

const shardCount = 64

type shard struct {
	mu      sync.Mutex
	hosts   map[string]*hostState
	sweepAt int // sweep idle hosts when the map reaches this size
	_       [40]byte
}

// hostState is what one host costs: about 130 bytes with its map entry.
type hostState struct {
	bucket *rate.Limiter // nil for an unpaced host
	until  time.Time     // parked until; zero or past: not parked
}

// minSweep is the map size below which a shard is never swept.
const minSweep = 64

func newLocalLimiter(clk Clock) *localLimiter { return &localLimiter{clock: clk} }

func (l *localLimiter) Reserve(_ context.Context, a Attempt) (Reservation, error) {
	if a.Pace.Unlimited() && a.Now.UnixNano() >= l.parkedUntil.Load() {
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
		st = s.add(a.Host, a.Now)
	}
	if st.until.After(a.Now) {
		return Reservation{ParkedUntil: st.until}, nil
	}
	if a.Pace.Unlimited() {
		return Reservation{OK: true}, nil
	}
	if st.bucket == nil || st.bucket.Limit() != a.Pace.Limit || st.bucket.Burst() != a.Pace.Burst {
		st.bucket = rate.NewLimiter(a.Pace.Limit, a.Pace.Burst)
	}
	r := st.bucket.ReserveN(a.Now, 1)
	delay := r.DelayFrom(a.Now)
	if !a.Latest.IsZero() && a.Now.Add(delay).After(a.Latest) {
		r.CancelAt(a.Now)
		return Reservation{Delay: delay}, nil
	}
	res := Reservation{OK: true, Delay: delay}
	if delay > 0 {
		res.Cancel = r.CancelAt
	}
	return res, nil
}

func (l *localLimiter) Park(_ context.Context, host string, until time.Time) error {
	s := &l.shards[shardOf(host)]
	s.mu.Lock()
	st := s.hosts[host]
	if st == nil {
		st = s.add(host, l.clock.Now())
	}
	if until.After(st.until) {
		st.until = until
	}
	s.mu.Unlock()
	for n := until.UnixNano(); ; {
		cur := l.parkedUntil.Load()
		if n <= cur || l.parkedUntil.CompareAndSwap(cur, n) {
			return nil
		}
	}
}

// add makes a host's entry, first dropping idle hosts when the shard has
// grown: a host whose bucket is full again and whose parking is over is
// indistinguishable from a new one, so forgetting it changes nothing. The
// sweep runs when the shard doubles, so its cost is constant per host added
// and a crawler of a million hosts holds only those active lately.
func (s *shard) add(host string, now time.Time) *hostState {
	if s.hosts == nil {
		s.hosts = make(map[string]*hostState)
		s.sweepAt = minSweep
	}
	if len(s.hosts) >= s.sweepAt {
		for h, st := range s.hosts {
			if st.idle(now) {
				delete(s.hosts, h)
			}
		}
		s.sweepAt = max(minSweep, 2*len(s.hosts))
	}
	st := &hostState{}
	s.hosts[host] = st
	return st
}

func (st *hostState) idle(now time.Time) bool {
	if st.until.After(now) {
		return false
	}
	return st.bucket == nil || st.bucket.TokensAt(now) >= float64(st.bucket.Burst())
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

// hostKey names the host an attempt goes to: lower case, without the
// scheme's default port. It allocates only for a host with upper case.
func hostKey(u *url.URL) string {
	if u == nil {
		return ""
	}
	h := u.Host
	switch {
	case u.Scheme == "https" && strings.HasSuffix(h, ":443"):
		h = h[:len(h)-len(":443")]
	case u.Scheme == "http" && strings.HasSuffix(h, ":80"):
		h = h[:len(h)-len(":80")]
	}
	return strings.ToLower(h)
}

// normalizeHostOption accepts what a user may pass to WithHostPace: a bare
// host, host:port or a URL.
func normalizeHostOption(host string) string {
	host = strings.TrimSpace(host)
	if strings.Contains(host, "://") {
		if u, err := url.Parse(host); err == nil {
			return hostKey(u)
		}
	}
	h := strings.ToLower(host)
	for _, p := range []string{":443", ":80"} {
		h = strings.TrimSuffix(h, p)
	}
	return h
}

// admit waits until an attempt to host may start: out the parking, if it
// fits the max wait and the deadline, then for the pace's token. It
// returns a *HostPausedError when the parking does not fit, and an error
// wrapping context.DeadlineExceeded when the token would come too late.
//
// now is the caller's reading of the clock: the success path reads it once
// per request, which matters where reading it costs 100 ns.
func (t *Transport) admit(ctx context.Context, host string, now time.Time) error {
	pace := t.paceFor(host)
	deadline, _ := ctx.Deadline()
	unpaced := Pace{Limit: rate.Inf}
	needToken := true
	// A parking can begin while we wait for a token, and be renewed while we
	// wait it out; the bound keeps a host that parks itself again and again
	// from holding a request for ever.
	for i := range 8 {
		if i > 0 {
			now = t.clock.Now()
		}
		a := Attempt{Host: host, Pace: pace, Now: now, Latest: deadline}
		if !needToken {
			a.Pace = unpaced
		}
		res, err := t.limiter.Reserve(ctx, a)
		if err != nil {
			return err
		}
		if res.OK {
			if res.Delay <= 0 {
				return nil
			}
			// Delay counts from now, and the limiter may have taken a
			// while to answer (a round trip to Redis): sleep until the
			// slot, not for Delay from here, or the attempt goes late and
			// bunches with the next one.
			if err := t.clock.Sleep(ctx, res.Delay-t.clock.Now().Sub(now)); err != nil {
				if res.Cancel != nil {
					res.Cancel(t.clock.Now())
				}
				return err
			}
			// Another request's answer may have parked the host while
			// this one waited: look again before sending.
			needToken = false
			continue
		}
		if res.ParkedUntil.IsZero() {
			return fmt.Errorf("retryhttp: pacing %s needs a wait of %v, past the request's deadline: %w",
				host, res.Delay, context.DeadlineExceeded)
		}
		rest := res.ParkedUntil.Sub(now)
		if rest > t.raMax || (!deadline.IsZero() && res.ParkedUntil.After(deadline)) {
			return &HostPausedError{Host: host, Until: res.ParkedUntil}
		}
		if err := t.clock.Sleep(ctx, rest); err != nil {
			return err
		}
		// The token taken before the parking was spent on nothing; after
		// it, the pace starts again, so the reopened host is not stormed.
		needToken = true
	}
	return &HostPausedError{Host: host, Until: t.clock.Now().Add(t.raMax)}
}

// admitted reports, without asking the limiter, that an attempt made at now
// may start at once: the in-process limiter paces no host and none is
// parked. It is the success path's admit, and needs no host name.
func (t *Transport) admitted(now time.Time) bool {
	return t.free != nil && now.UnixNano() >= t.free.parkedUntil.Load()
}

// paceFor returns the pace for host: its own, else the default.
func (t *Transport) paceFor(host string) Pace {
	if p, ok := t.hostPace[host]; ok {
		return p
	}
	return t.pace
}

// park tells the limiter that host asked for a wait of d from now. The
// parking is bounded by MaxParking whatever the server said.
func (t *Transport) park(ctx context.Context, host string, now time.Time, d time.Duration) {
	d = min(d, MaxParking)
	if err := t.limiter.Park(ctx, host, now.Add(d)); err != nil && t.logger != nil {
		t.logger.LogAttrs(ctx, slog.LevelWarn, "retryhttp: parking failed",
			slog.String("host", host), slog.String("error", err.Error()))
	}
}
