package retryhttp

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
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

// TestUnheldReadsNoClock: while other hosts hold records, a success to a
// host that holds none reads the clock no more than a calm one (issue 26's
// row "hosts without a record while 1,000 others hold one"); its answer is
// still told once the host gets a record of its own.
func TestUnheldReadsNoClock(t *testing.T) {
	clk := new(countingClock)
	tr := New(WithClock(clk), WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host != "ok.test" {
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}
		return memBase{}.RoundTrip(r)
	})))
	noRetry := ContextWithPolicy(context.Background(), PolicyNoRetry())
	for i := range 100 {
		req := mustGet(t, "http://h"+strconv.Itoa(i)+".test/").WithContext(noRetry)
		if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != 503 {
			t.Fatal(resp, err)
		}
	}
	if tr.free.entries.Load() == 0 {
		t.Fatal("no host holds an entry after 100 of them failed")
	}
	before := clk.reads.Load()
	const n = 10 * undatedBatch
	for range n {
		resp, err := tr.RoundTrip(mustGet(t, "http://ok.test/"))
		if err != nil || resp.StatusCode != 200 {
			t.Fatal(resp, err)
		}
	}
	if got, most := clk.reads.Load()-before, int64(2*n/undatedBatch+2); got > most {
		t.Errorf("%d successes to a host without a record, 100 others holding one, read the clock %d times, want at most %d", n, got, most)
	}
	before = clk.reads.Load()
	for i := range 10 {
		req := mustGet(t, "http://h"+strconv.Itoa(i)+".test/").WithContext(noRetry)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	if got := clk.reads.Load() - before; got < 10 {
		t.Errorf("10 requests to hosts with a record read the clock %d times, want one or more each", got)
	}
}

// TestUnheldAnswerToldToNewRecord: an attempt sent while its host held no
// entry, answered after the host got a record, is told to that record, as
// one sent before it (a burst's accepted answer, which held it).
func TestUnheldAnswerToldToNewRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch r.URL.Path {
			case "/slow":
				<-release
				return memBase{}.RoundTrip(r)
			case "/fail":
				return &http.Response{StatusCode: 500, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			}
			return memBase{}.RoundTrip(r)
		})))
		noRetry := ContextWithPolicy(context.Background(), PolicyNoRetry())
		// Another host holds a record: the Transport is not calm.
		if _, err := tr.RoundTrip(mustGet(t, "http://other.test/fail").WithContext(noRetry)); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := tr.RoundTrip(mustGet(t, "http://x.test/slow")); err != nil || resp.StatusCode != 200 {
				t.Error(resp, err)
			}
		}()
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		if _, err := tr.RoundTrip(mustGet(t, "http://x.test/fail").WithContext(noRetry)); err != nil {
			t.Fatal(err)
		}
		close(release)
		<-done
		l := tr.free
		s := &l.shards[shardOf(hostHash("x.test"))]
		s.mu.Lock()
		var accepts float64
		if e := s.hosts["x.test"]; e != nil && e.model != nil {
			m := e.model
			accepts = m.accepts.lastSecond(m.at(time.Now()))
		}
		s.mu.Unlock()
		// The 500 that made the record is served (the host answered), and
		// the slow 200 is the second.
		if accepts < 2 {
			t.Errorf("x.test's record counts %v answers served: the unheld attempt's 200 was not told", accepts)
		}
	})
}
