package redislimit_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// outage runs a paced Transport against a private redis-server for total,
// calling fail at failAt and heal at healAt, and returns what the host saw.
type outage struct {
	srv     *redistest.Server
	l       *redislimit.Limiter
	rdb     *redis.Client
	log     *logCounter
	calls   *callCounter
	host    *stub
	longest time.Duration
	// fellBack and cameBack: whether the Limiter was in fallback just
	// before heal, and back on Redis at the end.
	fellBack, cameBack bool
}

func runOutage(t *testing.T, ctxAware bool, opts []redislimit.Option, total, failAt, healAt time.Duration,
	fail, heal func(*redistest.Server) error) *outage {
	o := &outage{srv: redistest.StartT(t), log: newLogCounter(), calls: &callCounter{}}
	o.rdb = redis.NewClient(&redis.Options{Addr: o.srv.Addr, ContextTimeoutEnabled: ctxAware})
	t.Cleanup(func() { o.rdb.Close() })
	o.rdb.AddHook(o.calls)
	opts = append([]redislimit.Option{redislimit.WithLogger(slog.New(o.log))}, opts...)
	o.l = redislimit.New(o.rdb, opts...)
	// At the default 50 ms, a first call that times out on a loaded
	// machine leaves the process waiting for Redis, holding no share,
	// before the outage this test makes.
	warm(t, o.l)
	o.host = newStub(t)
	client := retryhttp.NewClient(retryhttp.WithLimiter(o.l), retryhttp.WithPace(pace, 1))

	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { o.longest = hammer(ctx, client, o.host.URL+"/", 4) })
	time.Sleep(failAt)
	if err := fail(o.srv); err != nil {
		t.Fatal(err)
	}
	time.Sleep(healAt - failAt)
	o.fellBack = o.l.Fallback()
	if err := heal(o.srv); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	o.cameBack = !o.l.Fallback()
	return o
}

// Redis stopped mid-run: the Limiter paces in process, requests neither
// hang nor go unpaced, one warning is logged, and once Redis is back
// (restarted, empty) the pace is shared through it again.
func TestRedisStoppedAndRestarted(t *testing.T) {
	o := runOutage(t, false, []redislimit.Option{redislimit.WithProbeInterval(250 * time.Millisecond)},
		3*time.Second, 800*time.Millisecond, 1800*time.Millisecond,
		func(s *redistest.Server) error { s.Kill(); return nil },
		func(s *redistest.Server) error { return s.Restart() })

	checkRate(t, o.host.times("/"), pace, 0.05)
	if !o.fellBack {
		t.Errorf("the Limiter did not fall back while Redis was down")
	}
	if !o.cameBack {
		t.Errorf("the Limiter did not go back to Redis after it restarted")
	}
	// Redis holds the host's bucket again: the pace is shared once more.
	if n := o.rdb.Keys(context.Background(), redislimit.DefaultPrefix+"*").Val(); len(n) == 0 {
		t.Errorf("no key in the restarted Redis: the Limiter did not use it again")
	}
	if o.longest > 600*time.Millisecond {
		t.Errorf("a request took %v; with 4 workers at %d/s none should wait much over 200ms", o.longest, pace)
	}
	if n := o.log.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings for one outage, want 1: %q", n, o.log.msgs)
	}
	if n := o.log.count(slog.LevelInfo); n != 1 {
		t.Errorf("%d notes of recovery, want 1: %q", n, o.log.msgs)
	}
	// While down, Redis was asked once per probe interval, not per
	// request: about 4 probes in the second it was down, plus the calls
	// in flight when it stopped (the go-redis retries of each count too).
	t.Logf("calls to Redis: %d, failed: %d", o.calls.calls.Load(), o.calls.failed.Load())
	if f := o.calls.failed.Load(); f > 20 {
		t.Errorf("%d calls to a stopped Redis: probing is not bounded", f)
	}
}

// Redis frozen mid-run (SIGSTOP: connections open, no answers): each
// call gives up after the Limiter's timeout, whatever the client's own read
// timeout (5 s by default), and the pace holds in process.
func TestRedisFrozen(t *testing.T) {
	for _, ctxAware := range []bool{false, true} {
		name := "plain client"
		if ctxAware {
			name = "ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) {
			o := runOutage(t, ctxAware, []redislimit.Option{redislimit.WithProbeInterval(250 * time.Millisecond)},
				2500*time.Millisecond, 500*time.Millisecond, 1500*time.Millisecond,
				(*redistest.Server).Freeze, (*redistest.Server).Thaw)
			ts := o.host.times("/")
			// Never faster than the pace. A call that timed out is still
			// run by Redis when it wakes and takes a slot nobody uses, so
			// the pace may dip by a few slots just after: only the upper
			// bound is tight.
			got := observedRate(ts)
			t.Logf("%d requests: %.2f/s for a pace of %d/s; longest request %v", len(ts), got, pace, o.longest)
			if got > 1.05*pace || got < 0.8*pace {
				t.Errorf("rate %.2f/s, want at most %d/s +5%% (and not far below)", got, pace)
			}
			if !o.fellBack {
				t.Errorf("the Limiter did not fall back while Redis was frozen")
			}
			if o.longest > 600*time.Millisecond {
				t.Errorf("a request took %v: the timeout did not hold", o.longest)
			}
			if n := o.log.count(slog.LevelWarn); n != 1 {
				t.Errorf("%d warnings for one outage, want 1: %q", n, o.log.msgs)
			}
		})
	}
}

// A Redis that is not there at all from the start: the process cannot know
// how many others share a paced host, nor whether they reach a Redis it
// does not, so it sends nothing to the host. A request whose deadline
// comes before the next probe fails at once as a wait for the pace past
// it; one without waits, and goes once Redis answers and the others have
// had a probe interval to come back. An unpaced host is sent to at once,
// one warning says why, and a process told its share (WithFallbackShare)
// paces at it.
func TestRedisAbsent(t *testing.T) {
	srv := redistest.StartT(t)
	srv.Kill()
	log := newLogCounter()
	l := redislimit.New(newClient(t, srv.Addr), redislimit.WithLogger(slog.New(log)),
		redislimit.WithProbeInterval(200*time.Millisecond))
	t.Cleanup(func() { l.Close() })
	host := newStub(t)
	client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, host.URL+"/paced", nil)
	start := time.Now()
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a paced request went out with no Redis ever reached: status %d", resp.StatusCode)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a paced request with no Redis ever reached: %v, want a deadline error", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("failing a request that cannot go took %v", took)
	}
	resp, err := retryhttp.NewClient(retryhttp.WithLimiter(l)).Get(host.URL + "/unpaced")
	if err != nil {
		t.Fatalf("an unpaced request with no Redis: %v", err)
	}
	resp.Body.Close()

	// A request with no deadline waits for Redis.
	done := make(chan time.Time, 1)
	go func() {
		resp, err := client.Get(host.URL + "/paced")
		if err == nil {
			resp.Body.Close()
		}
		done <- time.Now()
	}()
	time.Sleep(500 * time.Millisecond)
	if n := len(host.times("/paced")); n != 0 {
		t.Errorf("%d paced requests reached the host with no Redis ever reached", n)
	}
	back := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-done:
		t.Logf("the waiting request went %v after Redis came back", at.Sub(back).Round(time.Millisecond))
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting request did not go within 2 s of Redis coming back")
	}
	if n := log.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings, want 1: %q", n, log.msgs)
	}

	srv.Kill()
	told := redislimit.New(newClient(t, srv.Addr), redislimit.WithFallbackShare(1))
	t.Cleanup(func() { told.Close() })
	ctx, cancel = context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	longest := hammer(ctx, retryhttp.NewClient(retryhttp.WithLimiter(told), retryhttp.WithPace(pace, 1)), host.URL+"/told", 4)
	checkRate(t, host.times("/told"), pace, 0.05)
	if longest > 600*time.Millisecond {
		t.Errorf("a request took %v", longest)
	}
}

// A parking set while Redis is down holds in the process that set it and
// is handed to Redis when it answers again, for the other processes.
func TestParkingDuringOutageReachesRedis(t *testing.T) {
	srv := redistest.StartT(t)
	prefix := testPrefix(t)
	a := redislimit.New(newClient(t, srv.Addr), redislimit.WithPrefix(prefix),
		redislimit.WithProbeInterval(100*time.Millisecond))
	ctx := context.Background()
	srv.Kill()
	until := time.Now().Add(3 * time.Second)
	a.Park(ctx, host, until)
	p := retryhttp.Pace{Limit: 10, Burst: 1}
	if res := reserve(t, a, p, time.Now(), time.Time{}); res.ParkedUntil.IsZero() {
		t.Fatalf("the process that parked the host during the outage does not see it: %+v", res)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// Any call that reaches Redis brings the Limiter back, and hands over
	// the parking.
	b := newLimiter(t, srv.Addr, prefix)
	deadline := time.Now().Add(2 * time.Second)
	for {
		time.Sleep(50 * time.Millisecond)
		a.Reserve(ctx, retryhttp.Attempt{Host: "another.test", Pace: p, Now: time.Now()})
		res := reserve(t, b, p, time.Now(), time.Time{})
		if !res.ParkedUntil.IsZero() {
			within(t, "parking seen by another process", res.ParkedUntil.Sub(until), 0, 20*time.Millisecond)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the parking set during the outage never reached Redis (fallback: %v)", a.Fallback())
		}
	}
}
