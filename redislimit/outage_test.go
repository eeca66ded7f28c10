package redislimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// The in-process pacer continues from the bucket Redis held, not from the
// last slot Redis gave this process: at a pace of 20/s with a burst of 5,
// ten slots through Redis and then Redis stopped, the slots after it keep
// to the one bucket, burst included.
func TestFallbackContinuesSharedBucket(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	l := redislimit.New(newClient(t, srv.Addr), redislimit.WithPrefix(testPrefix(t)))
	t.Cleanup(func() { l.Close() })
	p := retryhttp.Pace{Limit: 20, Burst: 5}
	const interval = 50 * time.Millisecond
	ctx := context.Background()
	var slots []time.Time
	take := func() {
		now := time.Now()
		res, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: p, Now: now})
		if err != nil || !res.OK {
			t.Fatalf("Reserve = %+v, %v", res, err)
		}
		slots = append(slots, now.Add(res.Delay))
	}
	start := time.Now()
	for range 10 {
		take()
	}
	if l.Fallback() {
		t.Fatal("fell back before Redis stopped")
	}
	srv.Kill()
	for range 10 {
		take()
	}
	if !l.Fallback() {
		t.Fatal("did not fall back with Redis stopped")
	}
	// GCRA at 20/s with a burst of 5 from a full bucket at start: the
	// slot of index j comes no earlier than start + (j-4) intervals.
	for j, s := range slots {
		if earliest := start.Add(time.Duration(j-4) * interval); s.Before(earliest.Add(-time.Millisecond)) {
			t.Errorf("slot %d at %v, before the bucket allows it (%v): the switch brought a burst",
				j, s.Sub(start).Round(time.Millisecond), earliest.Sub(start))
		}
	}
	t.Logf("slots from start: first in process at %v (Redis's next was %v)",
		slots[10].Sub(start).Round(time.Millisecond), 6*interval)
}

// maxInWindow is the most requests in any window of length w.
func maxInWindow(ts []time.Time, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// closePairs counts consecutive requests closer than d.
func closePairs(ts []time.Time, d time.Duration) (int, time.Duration) {
	n, least := 0, time.Hour
	for i := 1; i < len(ts); i++ {
		gap := ts[i].Sub(ts[i-1])
		least = min(least, gap)
		if gap < d {
			n++
		}
	}
	return n, least
}

// sharedRun hammers one stub host from procs Limiters, each on its own
// client as separate processes would be, at pace with a burst of 1, for
// total; at failAt it calls fail, at healAt heal (nil: nothing).
func sharedRun(t *testing.T, srv *redistest.Server, procs int, ctxAware bool, total, failAt, healAt time.Duration,
	fail, heal func(*redistest.Server) error) *stub {
	host := newStub(t)
	prefix := testPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var wg sync.WaitGroup
	for range procs {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxAware})
		t.Cleanup(func() { rdb.Close() })
		// A timeout well above what a loaded test machine takes for a
		// loopback call, and well below the freezes.
		l := redislimit.New(rdb, redislimit.WithPrefix(prefix), redislimit.WithTimeout(250*time.Millisecond))
		t.Cleanup(func() { l.Close() })
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
		wg.Go(func() { hammer(ctx, client, host.URL+"/", 4) })
	}
	time.Sleep(failAt)
	if err := fail(srv); err != nil {
		t.Fatal(err)
	}
	if heal != nil {
		time.Sleep(healAt - failAt)
		if err := heal(srv); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	return host
}

func debugSleep(d time.Duration) func(*redistest.Server) error {
	return func(s *redistest.Server) error { return s.DebugSleep(d) }
}

// A Redis that freezes (DEBUG SLEEP) makes no request late: the check
// after a request's wait is answered in process, so no request waits out
// the timeout after its slot and lands on the next one's.
func TestNoRequestLateAtFreeze(t *testing.T) {
	t.Parallel()
	// A run with a close pair is run once more (runOnceMore): a full
	// -race run on a loaded machine saw one pair 5.4 ms apart, a request
	// whose goroutine was held up 45 ms; a check that waited on the
	// frozen Redis sends pairs 0.1-0.5 ms apart at every slot of the
	// freeze, every run.
	runOnceMore(t, func(try int, last bool) bool {
		srv := redistest.StartT(t)
		host := sharedRun(t, srv, 1, false, 3*time.Second, 800*time.Millisecond, 0, debugSleep(time.Second), nil)
		ts := host.times("/")
		n, least := closePairs(ts, 10*time.Millisecond)
		t.Logf("run %d: %d requests at %.2f/s; closest pair %v apart; %d pairs under 10ms", try, len(ts), observedRate(ts), least, n)
		if n > 0 && !last {
			return true
		}
		if n > 0 {
			t.Errorf("%d pairs of requests under 10ms apart at a pace of %d/s: a request went late onto the next slot", n, pace)
		}
		checkRate(t, ts, pace, 0.06)
		return false
	})
}

// An outage costs at most one burst above the pace across all processes,
// with no setting: three Limiters at 20/s, Redis stopped for a second and
// restarted, or frozen for a second. Each process paces at the share Redis
// last counted, from the bucket Redis last held, in its place in the
// round; coming back, they pace in process until all are back.
func TestOutageCostsAtMostOneBurst(t *testing.T) {
	for _, c := range []struct {
		name       string
		fail, heal func(*redistest.Server) error
	}{
		{"stopped", func(s *redistest.Server) error { s.Kill(); return nil }, (*redistest.Server).Restart},
		{"frozen", debugSleep(time.Second), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartT(t)
			host := sharedRun(t, srv, 3, false, 4*time.Second, 1200*time.Millisecond, 2200*time.Millisecond, c.fail, c.heal)
			ts := host.times("/")
			busiest := maxInWindow(ts, time.Second)
			t.Logf("per 200ms: %v", histogram(ts, 200*time.Millisecond))
			n, least := closePairs(ts, 10*time.Millisecond)
			var at []time.Duration
			for i := 1; i < len(ts); i++ {
				if ts[i].Sub(ts[i-1]) < 10*time.Millisecond {
					at = append(at, ts[i].Sub(ts[0]).Round(time.Millisecond))
				}
			}
			t.Logf("pairs under 10ms at %v", at)
			t.Logf("%d requests at %.2f/s; busiest second %d (pace %d, burst 1); closest pair %v, %d under 10ms",
				len(ts), observedRate(ts), busiest, pace, least, n)
			// One burst above the pace, and one for a request that
			// reached the stub a hair late at one end of the window.
			if busiest > pace+1+1 {
				t.Errorf("busiest second had %d requests, want at most %d (pace and one burst)", busiest, pace+1)
			}
			// Below the pace by what the outage costs: the calls in flight
			// when Redis went away (a timeout each), the wait for the
			// others to stop counting a process present before it paces
			// in process, and the return, a process at a time.
			if got := observedRate(ts); got < 0.7*pace {
				t.Errorf("rate %.2f/s, far below the pace of %d/s", got, pace)
			}
		})
	}
}

// Without the shared count (WithFallbackShare(1): each process takes the
// whole pace while Redis is away) the same outage sends three times the
// pace: the test above is not passing by accident.
func TestOutageWithoutShareOverruns(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	host := newStub(t)
	prefix := testPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		l := redislimit.New(newClient(t, srv.Addr), redislimit.WithPrefix(prefix), redislimit.WithFallbackShare(1))
		t.Cleanup(func() { l.Close() })
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
		wg.Go(func() { hammer(ctx, client, host.URL+"/", 4) })
	}
	time.Sleep(800 * time.Millisecond)
	srv.Kill()
	wg.Wait()
	if busiest := maxInWindow(host.times("/"), time.Second); busiest < 2*pace {
		t.Errorf("busiest second %d with each process at the whole pace, want about %d", busiest, 3*pace)
	}
}

// A bucket or parking that no process on Redis's clock can have written (a
// failover to a node whose clock is an hour behind) is reset, and no state
// holds a caller longer than the horizon at once.
func TestCorruptStateReset(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := newClient(t, addr)
	prefix := testPrefix(t)
	l := redislimit.New(rdb, redislimit.WithPrefix(prefix), redislimit.WithTimeout(testTimeout))
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	nowUS := tm.UnixMicro()
	rdb.HSet(ctx, prefix+"ahead.test", "t", nowUS+3600e6)
	rdb.HSet(ctx, prefix+"parked.test", "p", nowUS+2*3600e6)
	rdb.HSet(ctx, prefix+"rate.test", "st", "0.1", "r", "-3", "t", "nan")
	rdb.HSet(ctx, prefix+"queued.test", "t", nowUS+15e6)
	try := func(h string, p retryhttp.Pace) retryhttp.Reservation {
		t.Helper()
		res, err := l.Reserve(ctx, retryhttp.Attempt{Host: h, Pace: p, Now: time.Now()})
		if err != nil {
			t.Fatalf("Reserve %s: %v", h, err)
		}
		return res
	}
	if res := try("ahead.test", paced); !res.OK || res.Delay > 10*time.Millisecond {
		t.Errorf("a bucket an hour ahead: %+v, want a slot now", res)
	}
	if res := try("parked.test", paced); !res.OK || res.Delay > 10*time.Millisecond {
		t.Errorf("a parking of two hours (past MaxParking): %+v, want a slot now", res)
	}
	if res := try("rate.test", retryhttp.Pace{}); !res.OK || res.Delay != 0 {
		t.Errorf("a negative learned rate: %+v, want a slot now", res)
	}
	if p, err := l.Learn(ctx, "rate.test", retryhttp.Signal{Now: time.Now(), Reset: -1, Remaining: -1}); err != nil || !p.Pace.Unlimited() {
		t.Errorf("learned pace after a corrupt rate = %+v, %v; want unlimited", p, err)
	}
	// 15 s ahead at 10/s is a queue of 150: possible, so kept; but a
	// caller waits 10 s at most before it asks again.
	res := try("queued.test", paced)
	if res.OK || res.AskAgain.IsZero() {
		t.Fatalf("a bucket 15s ahead: %+v, want AskAgain", res)
	}
	within(t, "ask again in", time.Until(res.AskAgain), 5*time.Second, 100*time.Millisecond)
}

// histogram counts requests per bucket of d from the first.
func histogram(ts []time.Time, d time.Duration) []int {
	if len(ts) == 0 {
		return nil
	}
	out := make([]int, int(ts[len(ts)-1].Sub(ts[0])/d)+1)
	for _, x := range ts {
		out[int(x.Sub(ts[0])/d)]++
	}
	return out
}
