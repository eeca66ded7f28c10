package redislimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
	"golang.org/x/time/rate"
)

// One process of three loses Redis for 4 s while the others keep it: the
// host gets one pace between them through the cut and after it heals, and
// so it does with a fourth process starting during the cut, on Redis.
func TestPartialPartition(t *testing.T) {
	for _, newcomer := range []bool{false, true} {
		name := "three"
		if newcomer {
			name = "newcomer during the cut"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartT(t)
			proxy := redistest.StartProxy(t, srv.Addr)
			host := newFleetHost(t)
			const cut, heal, total = time.Second, 5 * time.Second, 6500 * time.Millisecond
			members := []*member{{addr: srv.Addr}, {addr: srv.Addr}, {addr: proxy.Addr}}
			if newcomer {
				members = append(members, &member{addr: srv.Addr, start: 2500 * time.Millisecond})
			}
			start := runFleet(t, host, testPrefix(t), total, members,
				event{cut, func() error { proxy.Cut(); return nil }},
				event{heal, func() error { proxy.Heal(); return nil }})
			ts := host.served()
			t.Logf("per second: %s", perSecond(ts, start, total))
			host.members(t, start, total)
			checkBusiest(t, "during the cut", ts, start, start.Add(cut-time.Second), start.Add(heal-time.Second))
			checkBusiest(t, "at the heal", ts, start, start.Add(heal-time.Second), start.Add(total))
			rate := float64(len(between(ts, start.Add(time.Second), start.Add(total-time.Second)))) / (total - 2*time.Second).Seconds()
			t.Logf("%.1f/s from 1 s to %v", rate, total-time.Second)
			if rate < 0.75*pace {
				t.Errorf("%.1f/s, far below the pace of %d/s", rate, pace)
			}
			// The process cut off is neither held up nor unpaced: it paces
			// its third in process, once the others can have stopped
			// counting it present.
			host.mu.Lock()
			cutOff := len(between(host.by["/2"], start.Add(cut+time.Second), start.Add(heal)))
			host.mu.Unlock()
			share := float64(pace) / 3 * (heal - cut - time.Second).Seconds()
			t.Logf("the process cut off sent %d in the last %v of the cut, its share being %.0f", cutOff, heal-cut-time.Second, share)
			if float64(cutOff) < 0.6*share {
				t.Errorf("the process cut off sent %d in %v, want about its share of %.0f", cutOff, heal-cut-time.Second, share)
			}
		})
	}
}

// A process that stops calling a host gives its share back: the others
// take the whole pace again at once, not after the 30 s a claim is kept
// for a process that may be cut off.
func TestIdleProcessGivesShareBack(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	host := newFleetHost(t)
	// It gives its claim back once it has not called for the time its
	// last call gave it to call again: its queue's lead, 600 ms here.
	const stop, total = 1500 * time.Millisecond, 4 * time.Second
	members := []*member{{addr: srv.Addr}, {addr: srv.Addr}, {addr: srv.Addr, stop: stop}}
	start := runFleet(t, host, testPrefix(t), total, members)
	ts := host.served()
	t.Logf("per second: %s", perSecond(ts, start, total))
	host.members(t, start, total)
	after := between(ts, start.Add(stop+time.Second), start.Add(total))
	rate := float64(len(after)) / (total - stop - time.Second).Seconds()
	t.Logf("%.1f/s from 1 s after one process stopped", rate)
	if rate < 0.9*pace {
		t.Errorf("%.1f/s after one process of three stopped, want the pace of %d/s", rate, pace)
	}
	checkBusiest(t, "whole run", ts, start, start, start.Add(total))
}

// A process that never reached Redis starts while Redis is down for all,
// beside two that counted themselves: it does not add a pace of its own.
func TestFirstContactDuringOutage(t *testing.T) {
	for _, c := range []struct {
		name       string
		fail, heal func(*redistest.Server) error
	}{
		{"stopped", func(s *redistest.Server) error { s.Kill(); return nil }, (*redistest.Server).Restart},
		{"frozen", debugSleep(3 * time.Second), func(*redistest.Server) error { return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartT(t)
			host := newFleetHost(t)
			const fail, newcomer, heal, total = time.Second, 1500 * time.Millisecond, 4 * time.Second, 5500 * time.Millisecond
			members := []*member{{addr: srv.Addr}, {addr: srv.Addr}, {addr: srv.Addr, start: newcomer}}
			start := runFleet(t, host, testPrefix(t), total, members,
				event{fail, func() error { return c.fail(srv) }},
				event{heal, func() error { return c.heal(srv) }})
			ts := host.served()
			t.Logf("per second: %s", perSecond(ts, start, total))
			host.members(t, start, total)
			checkBusiest(t, "whole run", ts, start, start, start.Add(total))
		})
	}
}

// A host parked for 30 s stays parked when Redis loses its data: restarted
// empty, or flushed, with no process falling back (go-redis's retries hide
// a restart this short), a process started after sends nothing to it.
func TestParkingOutlivesData(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(*redistest.Server) error
	}{
		{"restarted", (*redistest.Server).Restart},
		{"flushed", flushAll},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartT(t)
			host := newFleetHost(t)
			const park, lose, newcomer, total = time.Second, 1500 * time.Millisecond, 3 * time.Second, 5 * time.Second
			members := []*member{{addr: srv.Addr}, {addr: srv.Addr}, {addr: srv.Addr}, {addr: srv.Addr, start: newcomer}}
			start := runFleet(t, host, testPrefix(t), total, members,
				event{park, func() error { host.refuse.Store(30); return nil }},
				event{lose, func() error { return c.lose(srv) }})
			ts := host.served()
			parked := host.parkedAt()
			if parked.IsZero() {
				t.Fatal("the host never answered its 429")
			}
			after := between(ts, parked.Add(100*time.Millisecond), start.Add(total)) // not those already on the wire
			t.Logf("per second: %s; parked at %v; %d requests after the 429 asked for 30 s",
				perSecond(ts, start, total), parked.Sub(start).Round(time.Millisecond), len(after))
			if len(after) > 0 {
				t.Errorf("%d requests reached a host parked for 30 s after Redis lost the parking (first at %v)",
					len(after), after[0].Sub(start).Round(time.Millisecond))
			}
		})
	}
}

// capacityHost serves capacity requests a second (a bucket of capacity/4)
// and answers the rest 429 with no header, as learn_test's host does.
type capacityHost struct {
	*httptest.Server
	mu     sync.Mutex
	ok, no []time.Time
}

func newCapacityHost(t *testing.T, capacity int) *capacityHost {
	h := &capacityHost{}
	lim := rate.NewLimiter(rate.Limit(capacity), capacity/4)
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		h.mu.Lock()
		defer h.mu.Unlock()
		if lim.AllowN(now, 1) {
			h.ok = append(h.ok, now)
			return
		}
		h.no = append(h.no, now)
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *capacityHost) sent(from time.Time) (ok, no []time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return between(h.ok, from, from.Add(time.Hour)), between(h.no, from, from.Add(time.Hour))
}

// A learned pace outlives a quiet spell shorter than its minute: two
// processes learn a host that serves 20/s, stop, and a process starting
// 11 s later paces by what they learned from its first request, without
// relearning it from scratch.
func TestLearnedPaceKept(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	host := newCapacityHost(t, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		l := newLimiter(t, addr, prefix)
		t.Cleanup(func() { l.Close() })
		client := retryhttp.NewClient(retryhttp.WithLimiter(l))
		wg.Go(func() { hammer(ctx, client, host.URL+"/", 4) })
	}
	wg.Wait()
	ok, no := host.sent(time.Now().Add(-time.Minute))
	t.Logf("learning: %d accepted, %d refused in 8 s", len(ok), len(no))
	time.Sleep(11 * time.Second) // past learnWatch since the last refusal; within the minute
	l := newLimiter(t, addr, prefix)
	t.Cleanup(func() { l.Close() })
	tr := retryhttp.New(retryhttp.WithLimiter(l))
	learned, err := tr.HostPace(context.Background(), host.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("HostPace after 11 s quiet: %.1f/s", float64(learned.Limit))
	if learned.Unlimited() {
		t.Fatalf("HostPace after 11 s quiet = %+v, want the pace learned", learned)
	}
	start := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	hammer(ctx, &http.Client{Transport: tr}, host.URL+"/", 4)
	ok, no = host.sent(start)
	first := len(between(append(ok, no...), start, start.Add(100*time.Millisecond)))
	t.Logf("the newcomer: %d requests in its first 100 ms, %d accepted and %d refused in 1.5 s", first, len(ok), len(no))
	if max := 1 + int(float64(learned.Limit)/10+0.5) + 1; first > max {
		t.Errorf("%d requests in the first 100 ms at a learned pace of %.1f/s, want at most %d", first, float64(learned.Limit), max)
	}
	// At the pace learned the host refuses nothing at first; a relearn
	// from scratch starts with a burst it refuses. A pace the learners
	// had grown past the host's 20 a second when they stopped (a probe
	// not refused yet) is refused at first by the host, whoever uses it.
	early := between(no, start, start.Add(500*time.Millisecond))
	switch {
	case float64(learned.Limit) > 20:
		t.Logf("the learners stopped while probing past the host's 20/s: %d refusals in the first 500 ms not asserted", len(early))
	case len(early) > 0:
		t.Errorf("%d refusals in the first 500 ms: the newcomer relearned the host instead of pacing by what was learned", len(early))
	}
	if p, err := tr.HostPace(context.Background(), host.URL); err != nil || p.Unlimited() {
		t.Errorf("HostPace after the newcomer's run = %+v, %v; want a learned pace", p, err)
	}
}

// The shared bucket outlives Redis's data: restarted empty at once (no
// process falls back) or flushed, the slots already handed out are not
// handed out again.
func TestBucketOutlivesData(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(*redistest.Server) error
	}{
		{"restarted", (*redistest.Server).Restart},
		{"flushed", flushAll},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A run whose busiest second is over the bound is run once
			// more (runOnceMore): on the real clock, under -race, a run
			// now and then holds 23-24 (the core of 9f29470 too: 2 of 8
			// runs of -count 8), where a fault of the limiter's misses
			// every run. So is one whose pace stopped: alone, the
			// longest gap is 150-320 ms (16 runs); in the full suite
			// under -race, with the other tests on both cores, a restart
			// now and then shows 500-650 ms, the core before 95e0f16
			// too (533 ms).
			runOnceMore(t, func(try int, last bool) bool {
				srv := redistest.StartT(t)
				host := newFleetHost(t)
				const lose, total = 1500 * time.Millisecond, 4 * time.Second
				members := []*member{{addr: srv.Addr}, {addr: srv.Addr}, {addr: srv.Addr}}
				start := runFleet(t, host, testPrefix(t)+strconv.Itoa(try), total, members, event{lose, func() error { return c.lose(srv) }})
				ts := host.served()
				t.Logf("run %d: per second: %s", try, perSecond(ts, start, total))
				t.Logf("run %d: per 100ms from the loss: %v", try, histogram(between(ts, start.Add(lose), start.Add(total)), 100*time.Millisecond))
				from, to := start.Add(lose-500*time.Millisecond), start.Add(total-500*time.Millisecond)
				if !last && (overBusiest(ts, start, start, start.Add(total)) || stopped(ts, from, to)) {
					return true
				}
				checkBusiest(t, "whole run", ts, start, start, start.Add(total))
				checkGoesOn(t, ts, from, to)
				return false
			})
		})
	}
}

// checkGoesOn fails t when the pace stops for long in [from, to): the
// processes know what Redis lost, and keep their shares through it.
func checkGoesOn(t *testing.T, ts []time.Time, from, to time.Time) {
	t.Helper()
	rate, gap := goesOn(ts, from, to)
	t.Logf("%.1f/s around the loss, longest gap %v", rate, gap.Round(time.Millisecond))
	if stopped(ts, from, to) {
		t.Errorf("%.1f/s around the loss and a gap of %v: the pace stopped", rate, gap.Round(time.Millisecond))
	}
}

// goesOn is the rate in [from, to) and its longest gap.
func goesOn(ts []time.Time, from, to time.Time) (float64, time.Duration) {
	in := between(ts, from, to)
	gap := time.Duration(0)
	for i := 1; i < len(in); i++ {
		gap = max(gap, in[i].Sub(in[i-1]))
	}
	return float64(len(in)) / to.Sub(from).Seconds(), gap
}

// stopped reports a pace that stopped in [from, to): under 85 % of it, or
// a gap over 400 ms. The floor was 70 % while the processes paced half
// their shares or less in the lane after the loss (they waited for their
// own slots in process to pass before asking for more, and gave their
// claims back meanwhile): 14.0-16.0/s, and 13.6 in CI. Paced whole, the
// window (0.5 s before the loss to 2 s after) reads 18.4-19.6/s, the
// restart's own time and the switch to the lane included, alone and
// under load; 85 % (17/s) fails every run of the version before.
func stopped(ts []time.Time, from, to time.Time) bool {
	rate, gap := goesOn(ts, from, to)
	return rate < 0.85*pace || gap > 400*time.Millisecond
}

func flushAll(s *redistest.Server) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	return rdb.FlushAll(context.Background()).Err()
}

// A slow link (50-200 ms a command, past the 50 ms bound) for every
// process: each falls back at the bound, nobody pays the latency, and
// together they keep to the pace.
func TestSlowLink(t *testing.T) {
	t.Parallel()
	// The link slows once every process has been counted with its full
	// share (a process that joined late has less until the others have
	// heard of it, and waits meanwhile).
	const slow, total = 2 * time.Second, 6 * time.Second
	host, start, members, _ := slowLinkFleet(t, 50*time.Millisecond, 200*time.Millisecond, slow, total)
	ts := host.served()
	t.Logf("per second: %s", perSecond(ts, start, total))
	host.members(t, start, total)
	checkBusiest(t, "whole run", ts, start, start, start.Add(total))
	late := between(ts, start.Add(slow+time.Second), start.Add(total))
	rate := float64(len(late)) / (total - slow - time.Second).Seconds()
	t.Logf("%.1f/s on the slow link, after its first second", rate)
	if rate < 0.85*pace {
		t.Errorf("%.1f/s on the slow link, want near the pace of %d/s", rate, pace)
	}
	// A request waits, at most, for the slots its process already holds
	// and the others' claim on its share to end (the bucket's lead, 600
	// ms for twelve goroutines at 20/s, plus the 50 ms a late call may
	// still renew the claim and the round trip of the server's clock
	// estimate, up to the link's 200 ms), then for its place among four
	// at a third of the pace (600 ms): 1.45 s. 1.5 s was missed now and
	// then under -race on a loaded machine (1.59 s). A bound that did not
	// hold, a call waiting for the client's read timeout (3 s), takes
	// longer; one that waited for the link is a member that did not fall
	// back, checked first.
	for i, m := range members {
		if !m.l.Fallback() {
			t.Errorf("member %d did not fall back on a link slower than its bound", i)
		}
		d := time.Duration(m.longest.Load())
		t.Logf("member %d: longest request %v", i, d.Round(time.Millisecond))
		if d > 2*time.Second {
			t.Errorf("member %d: a request took %v", i, d)
		}
	}
}

// A call that reaches Redis after its caller gave up on it (a slow link
// past the timeout) takes no slot and renews no claim: its caller is
// pacing in process by then, and a slot it took would go unused while the
// claim would tell the others it is still there.
func TestLateCallsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	admin := newClient(t, srv.Addr)
	prefix := testPrefix(t)
	l := redislimit.New(newClient(t, proxy.Addr), redislimit.WithPrefix(prefix),
		redislimit.WithTimeout(100*time.Millisecond))
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	p := retryhttp.Pace{Limit: 20, Burst: 1}
	for range 3 {
		if res, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: p, Now: time.Now()}); err != nil || !res.OK {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
	}
	before := admin.HGetAll(ctx, prefix+host).Val()
	proxy.SetLatency(300*time.Millisecond, 300*time.Millisecond)
	for range 5 {
		if res, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: p, Now: time.Now()}); err != nil || !res.OK {
			t.Fatalf("Reserve on the slow link = %+v, %v", res, err)
		}
	}
	if !l.Fallback() {
		t.Fatal("the Limiter did not fall back on a link slower than its timeout")
	}
	time.Sleep(500 * time.Millisecond) // the late calls arrive
	after := admin.HGetAll(ctx, prefix+host).Val()
	t.Logf("bucket before %s, after %s", before["t"], after["t"])
	if after["t"] != before["t"] {
		t.Errorf("late calls moved the bucket from %s to %s: they took slots nobody uses", before["t"], after["t"])
	}
	for f, v := range after {
		if strings.HasPrefix(f, "a:") && v != before[f] {
			t.Errorf("a late call renewed the claim %s: %s, was %s", f, v, before[f])
		}
	}
}

// A process that joins two others and reaches Redis once just before it
// fails has heard of three processes, while the two others last heard of
// two and hold half the pace each: it takes what they leave, nothing,
// rather than a third on top. (The fleets met this when a loaded machine
// slowed a newcomer's start: 26.7/s at a pace of 20/s.)
func TestJoinerTakesWhatIsLeft(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	prefix := testPrefix(t)
	p := retryhttp.Pace{Limit: pace, Burst: 1}
	mk := func() *redislimit.Limiter {
		l := redislimit.New(newClient(t, srv.Addr), redislimit.WithPrefix(prefix), redislimit.WithTimeout(fleetTimeout))
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b, c := mk(), mk(), mk()
	ctx := context.Background()
	take := func(l *redislimit.Limiter) retryhttp.Reservation {
		res, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: p, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, l := range []*redislimit.Limiter{a, b, a, b} { // both count two
		take(l)
	}
	take(c) // the third, heard of by no one else
	srv.Kill()
	// Each takes in process what it can in 1.5 s, from ten goroutines.
	deadline := time.Now().Add(1500 * time.Millisecond)
	from := time.Now()
	got := make([]int, 3)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, l := range []*redislimit.Limiter{a, b, c} {
		for range 10 {
			wg.Go(func() {
				for range 100 {
					now := time.Now()
					res, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: p, Now: now, Latest: deadline})
					if err != nil || !res.OK {
						return
					}
					time.Sleep(res.Delay)
					mu.Lock()
					got[i]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	t.Logf("slots taken in process in 1.5 s: %v (%v)", got, time.Since(from).Round(time.Millisecond))
	if got[2] > 1 {
		t.Errorf("the joiner took %d slots in process, beside two holding half the pace each", got[2])
	}
	if total := got[0] + got[1] + got[2]; total > 1.5*pace+3 || total < pace {
		t.Errorf("%d slots in 1.5 s at a pace of %d/s", total, pace)
	}
}
