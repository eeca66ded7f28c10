package redislimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// A fleet is a few Limiters, each on its own client as separate processes
// would be, each with a Transport hammering one stub host from four
// goroutines at the shared pace of 20/s with a burst of 1, while faults
// are made on a schedule.

// member is one process of a fleet.
type member struct {
	addr  string                // where it reaches Redis: the server, or a proxy in front of it
	rdb   redis.UniversalClient // instead of addr: a client of the test's (a Ring)
	start time.Duration         // when it starts, from the start of the run
	stop  time.Duration         // when it stops; zero: at the end of the run
	opts  []redislimit.Option
	// warm: the member runs Check before the run, so that its first
	// calls find the scripts loaded and a connection open (a member with
	// a timeout of 50 ms on a loaded machine may otherwise time out on
	// them, and wait for Redis as a process that never reached it).
	warm bool
	l    *redislimit.Limiter // set by runFleet
	// longest is the longest a request of the member took, in ns.
	longest atomic.Int64
}

// event is a fault (or its end) made at a moment of the run.
type event struct {
	at time.Duration
	do func() error
}

// fleetTimeout bounds each call to Redis in the fleets: well above what a
// loaded test machine takes for a loopback call, well below the faults.
const fleetTimeout = 250 * time.Millisecond

// runFleet runs the members against host for total, making the events on
// their schedule, and returns when every member has stopped. A member's
// Limiter is closed when the test ends.
func runFleet(t *testing.T, host *fleetHost, prefix string, total time.Duration, members []*member, events ...event) time.Time {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(total))
	defer cancel()
	var wg sync.WaitGroup
	for i, m := range members {
		rdb := m.rdb
		if rdb == nil {
			c := redis.NewClient(&redis.Options{Addr: m.addr})
			t.Cleanup(func() { c.Close() })
			rdb = c
		}
		opts := append([]redislimit.Option{redislimit.WithPrefix(prefix), redislimit.WithTimeout(fleetTimeout)}, m.opts...)
		m.l = redislimit.New(rdb, opts...)
		t.Cleanup(func() { m.l.Close() })
		if m.warm {
			warm(t, m.l)
		}
		client := retryhttp.NewClient(retryhttp.WithLimiter(m.l), retryhttp.WithPace(pace, 1))
		wg.Go(func() {
			if !sleepUntil(ctx, start.Add(m.start)) {
				return
			}
			mctx := ctx
			if m.stop > 0 {
				var cancel context.CancelFunc
				mctx, cancel = context.WithDeadline(ctx, start.Add(m.stop))
				defer cancel()
			}
			fleetHammer(mctx, client, host.URL+"/"+strconv.Itoa(i), 4, &m.longest)
		})
	}
	sort.Slice(events, func(i, j int) bool { return events[i].at < events[j].at })
	playEvents(t, ctx, start, events)
	wg.Wait()
	return start
}

// warm runs l's Check before a run, so that its first calls find the
// scripts loaded and a connection open: a Limiter with a short timeout on
// a loaded machine may otherwise time out on them, and pace in process, or
// wait for Redis as a process that never reached it, from the start.
// Check itself is bounded by l's timeout: a few tries, within a second or
// so, and on without it.
func warm(t *testing.T, l *redislimit.Limiter) {
	t.Helper()
	var err error
	for range 10 {
		if err = l.Check(context.Background()); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("not warmed: %v", err)
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// fleetHammer is hammer for hosts that may be parked: a request that fails
// at once (the host paused past the run's end) is tried again 20 ms later,
// not in a tight loop.
func fleetHammer(ctx context.Context, client *http.Client, url string, n int, longest *atomic.Int64) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for range 10_000 {
				if ctx.Err() != nil {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				began := time.Now()
				resp, err := client.Do(req)
				took := int64(time.Since(began))
				for cur := longest.Load(); took > cur && !longest.CompareAndSwap(cur, took); {
					cur = longest.Load()
				}
				if err == nil {
					resp.Body.Close()
					continue
				}
				t := time.NewTimer(20 * time.Millisecond)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
		})
	}
	wg.Wait()
}

// fleetHost is a stub host that records when each request arrived, and
// that can be told to answer the next request 429 with a Retry-After.
type fleetHost struct {
	*httptest.Server
	mu     sync.Mutex
	hits   []time.Time
	by     map[string][]time.Time // by member
	refuse atomic.Int64           // seconds of Retry-After for the next request; 0: serve
	parked time.Time              // when the 429 went out
}

func newFleetHost(t *testing.T) *fleetHost {
	h := &fleetHost{by: make(map[string][]time.Time)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		if secs := h.refuse.Swap(0); secs > 0 {
			h.mu.Lock()
			h.parked = now
			h.mu.Unlock()
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		h.mu.Lock()
		h.hits = append(h.hits, now)
		h.by[r.URL.Path] = append(h.by[r.URL.Path], now)
		h.mu.Unlock()
		w.Write([]byte("ok"))
	}))
	t.Cleanup(h.Close)
	return h
}

// served returns when each request served arrived, in order.
func (h *fleetHost) served() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	ts := append([]time.Time(nil), h.hits...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return ts
}

func (h *fleetHost) parkedAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parked
}

// members logs what each member sent, per second from start.
func (h *fleetHost) members(t *testing.T, start time.Time, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	paths := make([]string, 0, len(h.by))
	for p := range h.by {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		t.Logf("member %s per second: %s", strings.TrimPrefix(p, "/"), perSecond(h.by[p], start, d))
	}
}

// between returns the moments of ts in [from, to).
func between(ts []time.Time, from, to time.Time) []time.Time {
	var out []time.Time
	for _, x := range ts {
		if !x.Before(from) && x.Before(to) {
			out = append(out, x)
		}
	}
	return out
}

// perSecond counts ts in the seconds from start, for the logs.
func perSecond(ts []time.Time, start time.Time, d time.Duration) string {
	out := make([]string, int(d/time.Second)+1)
	counts := make([]int, len(out))
	for _, x := range ts {
		if i := int(x.Sub(start) / time.Second); i >= 0 && i < len(counts) {
			counts[i]++
		}
	}
	for i, c := range counts {
		out[i] = strconv.Itoa(c)
	}
	return "[" + strings.Join(out, " ") + "]"
}

// busiest is the most requests of ts in any second that starts in [from,
// to), with when that second starts, from start.
func busiest(ts []time.Time, start, from, to time.Time) (int, time.Duration) {
	best, at := 0, time.Duration(0)
	for i, x := range ts {
		if x.Before(from) || !x.Before(to) {
			continue
		}
		n := 0
		for _, y := range ts[i:] {
			if y.Sub(x) >= time.Second {
				break
			}
			n++
		}
		if n > best {
			best, at = n, x.Sub(start)
		}
	}
	return best, at.Round(10 * time.Millisecond)
}

// checkBusiest fails t when a second starting in [from, to) holds more than
// the pace and one burst, with one more for a request that reached the
// stub a hair late at one end of the window; it logs what it found.
func checkBusiest(t *testing.T, what string, ts []time.Time, start, from, to time.Time) int {
	t.Helper()
	n, at := busiest(ts, start, from, to)
	t.Logf("%s: busiest second %d (at %v), pace %d with a burst of 1", what, n, at, pace)
	if n > pace+2 {
		t.Errorf("%s: the busiest second holds %d requests, want at most %d (the pace, one burst, one late)", what, n, pace+2)
	}
	return n
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// hostOf is the host of a stub's URL as the Transport names it.
func hostOf(url string) string {
	return strings.TrimPrefix(url, "http://")
}

func newRingLimiter(t *testing.T, r *redis.Ring) *redislimit.Limiter {
	l := redislimit.New(r, redislimit.WithTimeout(testTimeout))
	t.Cleanup(func() { l.Close() })
	return l
}

// playEvents does each event at its moment from start, in order, until ctx
// ends; an event's error fails t.
func playEvents(t *testing.T, ctx context.Context, start time.Time, events []event) {
	t.Helper()
	for _, e := range events {
		if !sleepUntil(ctx, start.Add(e.at)) {
			return
		}
		if err := e.do(); err != nil {
			t.Error(err)
		}
	}
}

// slowLinkFleet runs three members for total, each reaching Redis through
// a proxy of its own at the default timeout (warmed up first, see warm),
// and slows every link to lo-hi a command at slow, once every member has
// been counted with its full share. It returns the host, the start of
// the run, the members, and when each member was first seen pacing in
// process from the slowing on (sampled every 20 ms; zero: never).
func slowLinkFleet(t *testing.T, lo, hi, slow, total time.Duration) (*fleetHost, time.Time, []*member, []time.Duration) {
	t.Helper()
	srv := redistest.StartT(t)
	host := newFleetHost(t)
	var members []*member
	var proxies []*redistest.Proxy
	for range 3 {
		p := redistest.StartProxy(t, srv.Addr)
		proxies = append(proxies, p)
		members = append(members, &member{addr: p.Addr, warm: true, opts: []redislimit.Option{redislimit.WithTimeout(redislimit.DefaultTimeout)}})
	}
	events := []event{{slow, func() error {
		for _, p := range proxies {
			p.SetLatency(lo, hi)
		}
		return nil
	}}}
	fell := make([]time.Duration, len(members))
	for at := slow + 20*time.Millisecond; at < total; at += 20 * time.Millisecond {
		events = append(events, event{at, func() error {
			for i, m := range members {
				if fell[i] == 0 && m.l.Fallback() {
					fell[i] = at
				}
			}
			return nil
		}})
	}
	start := runFleet(t, host, testPrefix(t), total, members, events...)
	return host, start, members, fell
}

// runOnceMore runs run, and once more when its first run asks for it
// (run returns true: it missed a bound that the real clock misses now and
// then, under -race on a loaded machine, and made no check); the second
// run is the last (last is true), and run makes its checks on it
// whatever it finds. So a run that misses by chance costs one more run,
// and a fault of the limiter, which misses every run, still fails.
func runOnceMore(t *testing.T, run func(try int, last bool) (again bool)) {
	t.Helper()
	for try := 1; try <= 2; try++ {
		if !run(try, try == 2) {
			return
		}
		t.Logf("run %d: over the bound: once more", try)
	}
}

// overBusiest reports whether a second starting in [from, to) holds more
// than checkBusiest allows.
func overBusiest(ts []time.Time, start, from, to time.Time) bool {
	n, _ := busiest(ts, start, from, to)
	return n > pace+2
}
