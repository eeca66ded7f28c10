package redislimit_test

import (
	"context"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

var cmdstat = regexp.MustCompile(`cmdstat_(evalsha|eval):calls=(\d+)`)

// scriptCalls is how many EVALSHA and EVAL the server has run.
func scriptCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range cmdstat.FindAllStringSubmatch(info, -1) {
		k, _ := strconv.Atoi(m[2])
		n += k
	}
	return n
}

// Under load (three Limiters, four goroutines each, all waiting for the
// shared pace of 20/s) each request costs one script call: the check for
// a parking after the wait is answered in process, from the subscription.
// The calls are counted over 5 s (100 requests): over 2.5 s, one episode
// of extra calls on a machine busy with the other modules' tests (6, once
// in a CI run) read as 1.12 a request.
func TestOneScriptCallPerRequest(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	admin := newClient(t, srv.Addr)
	host := newStub(t)
	prefix := testPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		l := redislimit.New(newClient(t, srv.Addr), redislimit.WithPrefix(prefix), redislimit.WithTimeout(testTimeout))
		t.Cleanup(func() { l.Close() })
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
		wg.Go(func() { hammer(ctx, client, host.URL+"/", 4) })
	}
	time.Sleep(500 * time.Millisecond)
	from, calls0 := time.Now(), scriptCalls(t, admin)
	time.Sleep(5 * time.Second)
	to, calls1 := time.Now(), scriptCalls(t, admin)
	wg.Wait()
	requests := 0
	for _, ts := range host.times("/") {
		if !ts.Before(from) && ts.Before(to) {
			requests++
		}
	}
	perRequest := float64(calls1-calls0) / float64(requests)
	t.Logf("%d requests, %d script calls: %.2f EVALSHA per request", requests, calls1-calls0, perRequest)
	if perRequest > 1.1 {
		t.Errorf("%.2f script calls per request, want 1", perRequest)
	}
}

// A parking set by one process while another's request waits for its
// slot reaches that request without a call to Redis.
func TestParkingReachesWaiterWithoutRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	counter := &scriptCounter{}
	rdb := newClient(t, srv.Addr)
	rdb.AddHook(counter)
	b := redislimit.New(rdb, redislimit.WithTimeout(testTimeout))
	t.Cleanup(func() { b.Close() })
	a := redislimit.New(newClient(t, srv.Addr), redislimit.WithTimeout(testTimeout))
	t.Cleanup(func() { a.Close() })
	checkParkingReachesWaiter(t, a, b)
	// Two Reserves, and nothing for the check.
	if n := counter.n.Load(); n != 2 {
		t.Errorf("%d calls to Redis by the waiting Limiter, want 2 (its two slots)", n)
	}
}

// scriptCounter is a go-redis hook that counts the scripts run (EVALSHA,
// or EVAL after NOSCRIPT: one per script run).
type scriptCounter struct{ n atomic.Int64 }

func (c *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); (name == "evalsha" && !redis.HasErrorPrefix(err, "NOSCRIPT")) || name == "eval" {
			c.n.Add(1)
		}
		return err
	}
}
