package redislimit_test

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// TestUnpacedHostSkipsRedis: with a Redis replying in 50-200 ms (a proxy
// delaying every command) and a timeout of 500 ms, requests to a host
// with no pace, no parking and no down mark do not wait on Redis, but for
// the process's first; a parking another process sets still reaches them,
// through the subscription or the refresh.
func TestUnpacedHostSkipsRedis(t *testing.T) {
	srv := redistest.StartT(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	prefix := testPrefix(t)
	rdb := newClient(t, proxy.Addr)
	a := redislimit.New(rdb, redislimit.WithPrefix(prefix), redislimit.WithTimeout(500*time.Millisecond))
	t.Cleanup(func() { a.Close() })
	b := newLimiter(t, srv.Addr, prefix)
	t.Cleanup(func() { b.Close() })
	stub := newStub(t)
	client := retryhttp.NewClient(retryhttp.WithLimiter(a), retryhttp.WithMaxAttempts(1))
	// The scripts loaded, a connection made: the first request's call is
	// one round trip, as in a process that has run a while.
	if err := b.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(50*time.Millisecond, 200*time.Millisecond)
	get := func() (time.Duration, error) {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, stub.URL+"/free", nil)
		start := time.Now()
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return time.Since(start), err
	}
	var took []time.Duration
	for range 60 {
		d, err := get()
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		took = append(took, d)
		if len(took) > 1 && d > 30*time.Millisecond {
			t.Logf("request %d took %v (fallback %v)", len(took), d, a.Fallback())
		}
		time.Sleep(20 * time.Millisecond)
	}
	first := took[0]
	rest := append([]time.Duration(nil), took[1:]...)
	sort.Slice(rest, func(i, j int) bool { return rest[i] < rest[j] })
	median, worst := rest[len(rest)/2], rest[len(rest)-1]
	t.Logf("first request %v; the %d after: median %v, slowest %v", first.Round(time.Millisecond), len(rest),
		median.Round(100*time.Microsecond), worst.Round(100*time.Microsecond))
	if worst >= 50*time.Millisecond { // the least a call to Redis takes here
		t.Errorf("a request to an unpaced host took %v with Redis 50-200 ms away, want no wait on Redis", worst)
	}
	if a.Fallback() {
		t.Errorf("the limiter fell back")
	}
	if first < 50*time.Millisecond {
		t.Errorf("the first request took %v: it did not ask Redis", first)
	}
	// A parking set by another process reaches this one within a round
	// trip or a refresh, and holds.
	until := time.Now().Add(3 * time.Second)
	if err := b.Park(context.Background(), hostOf(stub.URL), until); err != nil {
		t.Fatal(err)
	}
	parkedAt := time.Now()
	var sent int
	for time.Since(parkedAt) < 1500*time.Millisecond {
		_, err := get()
		switch {
		case err == nil:
			sent++ // sent, or waited the parking out
		case !errors.Is(err, retryhttp.ErrHostPaused):
			t.Fatalf("request to the parked host: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	late := 0
	for _, at := range stub.times("/free") {
		if at.After(parkedAt) {
			t.Logf("sent %v after the parking", at.Sub(parkedAt).Round(time.Millisecond))
		}
		if at.After(parkedAt.Add(500*time.Millisecond)) && at.Before(until) {
			late++ // one that waited the parking out goes after it
		}
	}
	t.Logf("%d requests answered in the 1.5 s after the parking, %d sent into it 500 ms after it", sent, late)
	if late > 0 {
		t.Errorf("%d requests sent into the parking more than 500 ms after it was set", late)
	}
}
