package redislimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// Against a frozen Redis, a client without ContextTimeoutEnabled blocks
// for its read timeout: the Limiter's calls still end at its own timeout,
// and no more than maxWorkers goroutines are stuck on the client however
// many calls are made.
func TestCallsBoundedOnFrozenRedis(t *testing.T) {
	srv := redistest.StartT(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	l := New(rdb, WithPrefix("retryhttp-test:calls:"))
	if l.direct {
		t.Fatal("a plain client is called directly")
	}
	ctx := context.Background()
	if _, err := l.run(ctx, l.servers[0], reserveScript, []string{l.prefix + "h"}, 0, 1, "", "", "", "", 0, "", 0, "", "", "", "", 0); err != nil {
		t.Fatalf("call to a live Redis: %v", err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer srv.Thaw()
	const calls = 3 * maxWorkers
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		longest time.Duration
		bad     error
	)
	for range calls {
		wg.Go(func() {
			start := time.Now()
			_, err := l.run(ctx, l.servers[0], reserveScript, []string{l.prefix + "h"}, 0, 1, "", "", "", "", 0, "", 0, "", "", "", "", 0)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			longest = max(longest, took)
			if !errors.Is(err, errTimeout) && bad == nil {
				bad = err
			}
		})
	}
	wg.Wait()
	if bad != nil {
		t.Errorf("a call to a frozen Redis ended with %v, want errTimeout", bad)
	}
	if longest > 500*time.Millisecond {
		t.Errorf("a call took %v with a timeout of %v", longest, l.timeout)
	}
	if n := l.workers.Load(); n > maxWorkers {
		t.Errorf("%d workers, want at most %d", n, maxWorkers)
	}
}
