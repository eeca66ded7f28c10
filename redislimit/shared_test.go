package redislimit_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
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
