package retryhttp

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countingClock is the real clock, counting its readings.
type countingClock struct{ reads atomic.Int64 }

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return time.Now()
}

func (c *countingClock) Sleep(ctx context.Context, d time.Duration) error {
	return realClock{}.Sleep(ctx, d)
}

// TestCalmReadsNoClock: while no host holds an entry, a success reads no
// clock, but for the two readings that date each batch of undatedBatch
// first tries; once a host has a record (one 503), every request reads it.
func TestCalmReadsNoClock(t *testing.T) {
	clk := new(countingClock)
	fail := atomic.Bool{}
	tr := New(WithClock(clk), WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if fail.Load() {
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}
		return memBase{}.RoundTrip(r)
	})))
	base := clk.reads.Load() // New's own
	const n = 10 * undatedBatch
	for range n {
		resp, err := tr.RoundTrip(mustGet(t, "http://calm.test/"))
		if err != nil || resp.StatusCode != 200 {
			t.Fatal(resp, err)
		}
	}
	if got, most := clk.reads.Load()-base, int64(2*n/undatedBatch); got > most {
		t.Errorf("%d successes read the clock %d times, want at most %d", n, got, most)
	}
	fail.Store(true)
	req := mustGet(t, "http://calm.test/").WithContext(ContextWithPolicy(context.Background(), PolicyNoRetry()))
	if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != 503 {
		t.Fatal(resp, err)
	}
	fail.Store(false)
	before := clk.reads.Load()
	for range 10 {
		if _, err := tr.RoundTrip(mustGet(t, "http://calm.test/")); err != nil {
			t.Fatal(err)
		}
	}
	if got := clk.reads.Load() - before; got < 10 {
		t.Errorf("10 successes to a host with a record read the clock %d times, want one or more each", got)
	}
}

func mustGet(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
