package redislimit_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
	"golang.org/x/time/rate"
)

// The pace of these tests: 20 a second, so that a run of 2.5 s sees about
// 50 requests and one request more or less is 2 %.
const (
	pace   = 20
	runFor = 2500 * time.Millisecond
)

// Three Transports, each with its own Limiter and its own connections to
// Redis, as three processes would have, keep together to one pace.
func TestTransportsShareOnePace(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	host := newStub(t)
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		l := newLimiter(t, addr, prefix)
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
		wg.Go(func() { hammer(ctx, client, host.URL+"/", 4) })
	}
	wg.Wait()
	checkRate(t, host.times("/"), pace, 0.05)
}

// Without the shared limiter the same three would send three times the
// pace: the test above is not passing by accident.
func TestInProcessPacersDoNotShare(t *testing.T) {
	host := newStub(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		client := retryhttp.NewClient(retryhttp.WithPace(pace, 1))
		wg.Go(func() { hammer(ctx, client, host.URL+"/", 4) })
	}
	wg.Wait()
	if got := observedRate(host.times("/")); got < 2.5*pace {
		t.Errorf("three unshared pacers sent %.1f/s, want about %d/s", got, 3*pace)
	}
}

// Three OS processes sharing one Redis keep together to one pace.
func TestProcessesShareOnePace(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	host := newStub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			errs <- runHelper(ctx, "hammer",
				envURL+"="+host.URL+"/", envRedis+"="+addr, envPrefix+"="+prefix,
				envPace+"=20", envFor+"="+runFor.String())
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ts := host.times("/")
	if len(ts) < 30 {
		t.Fatalf("the workers sent %d requests in %v; want about %v", len(ts), runFor, pace*runFor.Seconds())
	}
	checkRate(t, ts, pace, 0.05)
}

// A parking set by one process holds in another: its request waits out the
// rest when that fits the Retry-After max, and fails fast with
// ErrHostPaused when it does not.
func TestParkingSeenByOtherProcess(t *testing.T) {
	addr := redistest.Addr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("waits", func(t *testing.T) {
		prefix := testPrefix(t)
		host := newStub(t)
		// The other process is answered "429, Retry-After: 1": the host is
		// parked for a second, for everyone.
		if err := runHelper(ctx, "park", envURL+"="+host.URL+"/429/1", envRedis+"="+addr,
			envPrefix+"="+prefix, envRAMax+"=60s"); err != nil {
			t.Fatal(err)
		}
		parkedAt := host.times("/429/1")[0]
		l := newLimiter(t, addr, prefix)
		client := retryhttp.NewClient(retryhttp.WithLimiter(l))
		resp, err := client.Get(host.URL + "/ok")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		waited := host.times("/ok")[0].Sub(parkedAt)
		if waited < time.Second || waited > 1500*time.Millisecond {
			t.Errorf("the request reached the host %v after the 429 that parked it; want just over 1s", waited)
		}
	})

	t.Run("fails fast", func(t *testing.T) {
		prefix := testPrefix(t)
		host := newStub(t)
		// "Retry-After: 30" is beyond the max of 2 s: the other process
		// gives up and parks the host for 30 s.
		if err := runHelper(ctx, "park", envURL+"="+host.URL+"/429/30", envRedis+"="+addr,
			envPrefix+"="+prefix, envRAMax+"=2s"); err != nil {
			t.Fatal(err)
		}
		l := newLimiter(t, addr, prefix)
		client := retryhttp.NewClient(retryhttp.WithLimiter(l),
			retryhttp.WithRetryAfterLimits(time.Second, 2*time.Second))
		start := time.Now()
		resp, err := client.Get(host.URL + "/ok")
		took := time.Since(start)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("request to a host parked for 30s got status %d, want ErrHostPaused", resp.StatusCode)
		}
		if !errors.Is(err, retryhttp.ErrHostPaused) {
			t.Fatalf("error %v, want one wrapping ErrHostPaused", err)
		}
		var pe *retryhttp.HostPausedError
		if errors.As(err, &pe) {
			if rest := time.Until(pe.Until); rest < 28*time.Second || rest > 30*time.Second {
				t.Errorf("paused until %v from now, want about 30s", rest)
			}
		}
		if took > 500*time.Millisecond {
			t.Errorf("failing fast took %v", took)
		}
		if n := len(host.times("/ok")); n != 0 {
			t.Errorf("the parked host got %d requests", n)
		}
	})
}

// A Transport with the Redis limiter and an unpaced host still paces
// nothing, and the parking check is the only cost.
func TestUnpacedTransport(t *testing.T) {
	l := newLimiter(t, redistest.Addr(t), testPrefix(t))
	host := newStub(t)
	client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(rate.Inf, 1))
	start := time.Now()
	for range 50 {
		resp, err := client.Get(host.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("50 unpaced requests took %v", took)
	}
}

// With a shared Limiter, the host model still runs in each process: three
// Transports, 10 workers each, against a dead address find it down within
// a few dials each and hand requests back at once (ErrHostDown), probing
// it twice a second, instead of dialling it for every request.
func TestDeadHostHandedBackWithSharedLimiter(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/"
	ln.Close() // every connection refused
	var dials, calls, down atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		base := &http.Transport{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, address)
		}}
		client := retryhttp.NewClient(retryhttp.WithLimiter(newLimiter(t, addr, prefix)), retryhttp.WithBase(base),
			retryhttp.WithPace(1000, 100))
		for range 10 {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, dead, nil)
					_, err := client.Do(req)
					calls.Add(1)
					if errors.Is(err, retryhttp.ErrHostDown) {
						down.Add(1)
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d calls, %d handed back as down, %d dials", calls.Load(), down.Load(), dials.Load())
	// Each process: its first requests' tries, then a probe every 500 ms.
	if dials.Load() > 3*(30+3*4) || down.Load()*2 < calls.Load() {
		t.Errorf("%d dials for %d calls (%d down): want the host found down and probed, not dialled per call", dials.Load(), calls.Load(), down.Load())
	}
}

// A host one process found down is down for the others: a process that
// starts once the first has found the address dead hands its requests
// back at once (ErrHostDown) and dials it at most for the probes the
// processes share, one every half second among them all.
func TestDownHostShared(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/"
	ln.Close()
	client := func(dials *atomic.Int64) *http.Client {
		base := &http.Transport{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, address)
		}}
		return retryhttp.NewClient(retryhttp.WithLimiter(newLimiter(t, addr, prefix)), retryhttp.WithBase(base),
			retryhttp.WithPace(1000, 100))
	}
	run := func(ctx context.Context, c *http.Client, workers int) (calls, down int64) {
		var n, d atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, dead, nil)
					_, err := c.Do(req)
					n.Add(1)
					if errors.Is(err, retryhttp.ErrHostDown) {
						d.Add(1)
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		return n.Load(), d.Load()
	}
	var firstDials, laterDials atomic.Int64
	first := client(&firstDials)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { // the first process finds the host down, and keeps it so
		defer close(done)
		run(ctx, first, 5)
	}()
	time.Sleep(500 * time.Millisecond)
	later := client(&laterDials)
	lctx, lcancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer lcancel()
	calls, down := run(lctx, later, 10)
	<-done
	t.Logf("the later process: %d calls, %d handed back as down, %d dials (the first: %d dials)", calls, down, laterDials.Load(), firstDials.Load())
	if laterDials.Load() > 6 || down*10 < calls*9 {
		t.Errorf("the later process dialled the dead host %d times for %d calls (%d down): want it told down by the first, a few probes at most", laterDials.Load(), calls, down)
	}
}

// A host down for every process comes back for every process: the first
// answer that gets through, whichever process's probe it is, clears it,
// and each process is served again within a second of the return.
func TestDownHostSharedReturns(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hostAddr := ln.Addr().String()
	ln.Close() // down: every connection refused
	url := "http://" + hostAddr + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 3500*time.Millisecond)
	defer cancel()
	start := time.Now()
	const upAt = 1500 * time.Millisecond
	up := make(chan *http.Server, 1)
	go func() {
		time.Sleep(upAt)
		for range 50 { // the port was ours a moment ago: it is free again
			l, err := net.Listen("tcp", hostAddr)
			if err == nil {
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
				go srv.Serve(l)
				up <- srv
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		up <- nil
	}()
	var back [2]atomic.Int64 // when each process was first served, since the start
	var served atomic.Int64
	var wg sync.WaitGroup
	for p := range 2 {
		client := retryhttp.NewClient(retryhttp.WithLimiter(newLimiter(t, addr, prefix)), retryhttp.WithPace(1000, 100))
		for range 5 {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
					resp, err := client.Do(req)
					if err == nil {
						resp.Body.Close()
						if resp.StatusCode == http.StatusOK {
							served.Add(1)
							back[p].CompareAndSwap(0, int64(time.Since(start)))
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	if srv := <-up; srv != nil {
		srv.Close()
	} else {
		t.Skip("the port could not be listened on again")
	}
	b0, b1 := time.Duration(back[0].Load()), time.Duration(back[1].Load())
	t.Logf("back at %v and %v (the host at %v); %d served", b0, b1, upAt, served.Load())
	for p, b := range []time.Duration{b0, b1} {
		if b == 0 || b > upAt+time.Second {
			t.Errorf("process %d served again at %v, want within a second of the return at %v", p, b, upAt)
		}
	}
}
