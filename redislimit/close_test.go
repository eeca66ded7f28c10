package redislimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
	"go.uber.org/goleak"
)

// Close stops every goroutine the Limiter started (the workers that call a
// plain client, the parking listener, the policy check) and waits for
// them, so that goleak in a user's tests passes; it is safe twice, and the
// Limiter refuses calls after it.
func TestCloseStopsGoroutines(t *testing.T) {
	srv := redistest.StartT(t)
	host := newStub(t)
	before := goleak.IgnoreCurrent()

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr}) // plain: worker goroutines
	l := redislimit.New(rdb, redislimit.WithPrefix(testPrefix(t)))
	client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	hammer(ctx, client, host.URL+"/", 4)
	cancel()
	if err := l.Park(context.Background(), "parked.test", time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()

	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close took %v", took)
	}
	rdb.Close()
	goleak.VerifyNone(t, before)

	a := retryhttp.Attempt{Host: "x.test", Pace: retryhttp.Pace{Limit: 10, Burst: 1}, Now: time.Now()}
	if _, err := l.Reserve(context.Background(), a); !errors.Is(err, redislimit.ErrClosed) {
		t.Errorf("Reserve after Close: %v, want ErrClosed", err)
	}
	if err := l.Park(context.Background(), "x.test", time.Now().Add(time.Second)); !errors.Is(err, redislimit.ErrClosed) {
		t.Errorf("Park after Close: %v, want ErrClosed", err)
	}
}
