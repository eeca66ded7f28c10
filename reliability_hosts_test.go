package retryhttp

// Reliability of the per-host state: the in-process limiter holds only
// the hosts parked lately, not every host met, and its sweeps never drop
// a host still parked. Issue 4.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// ---------------------------------------------------------------------------
// Per-host state: bounded, and never at the cost of a parking.

// relHostEntries counts the in-process limiter's host entries.
func relHostEntries(tr *Transport) int {
	l := tr.limiter.(*localLimiter)
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.hosts)
		s.mu.Unlock()
	}
	return n
}

// TestReliabilityHostStateBounded is a crawler: 20,000 hosts, each of
// which answers once with Retry-After: 1, one host every millisecond. The
// Transport holds only the hosts parked lately, not every host it met.
func TestReliabilityHostStateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			return relResponse(r, http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}, nil, 0), nil
		})
		tr := New(WithBase(base), WithMaxAttempts(1), WithPace(1000, 10))
		const hosts = 20_000
		peak := 0
		for i := range hosts {
			resp, err := tr.RoundTrip(relGet(t, context.Background(), fmt.Sprintf("http://h%d.crawl.test/", i)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if i%1000 == 999 {
				peak = max(peak, relHostEntries(tr))
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("%d hosts met, at most %d held (about 1,000 parked at any time)", hosts, peak)
		// A shard is swept when it doubles past the hosts it kept: with
		// about 1,000 hosts parked at a time, 64 shards hold a few
		// thousand at most.
		if peak > 2*shardCount*minSweep {
			t.Errorf("the Transport held %d hosts of %d", peak, hosts)
		}
	})
}

// TestReliabilityParkingSurvivesSweep parks one host for 30 s, then, at
// the same moment, a crowd of other hosts for 40 s each (a crawler meeting
// a rate-limited CDN). The in-process limiter sweeps idle hosts as it
// grows; none of these is idle, so every one must stay parked.
func TestReliabilityParkingSurvivesSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int64
		var checking atomic.Bool
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent.Add(1)
			if checking.Load() {
				// A request that got through is answered plainly, so that it
				// parks nothing and the count stays that of the first phase.
				return relResponse(r, http.StatusOK, nil, nil, 0), nil
			}
			wait := "40"
			if r.URL.Host == "first.test" {
				wait = "30"
			}
			return relResponse(r, http.StatusTooManyRequests, http.Header{"Retry-After": {wait}}, nil, 0), nil
		})
		tr := New(WithBase(base), WithMaxAttempts(1))
		do := func(ctx context.Context, host string) error {
			resp, err := tr.RoundTrip(relGet(t, ctx, "http://"+host+"/"))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		const crowd = 5000
		if err := do(context.Background(), "first.test"); err != nil {
			t.Fatal(err)
		}
		for i := range crowd {
			if err := do(context.Background(), fmt.Sprintf("c%d.test", i)); err != nil {
				t.Fatal(err)
			}
		}
		sent.Store(0)
		checking.Store(true)
		// Every host is parked: a request with a 1 s deadline fails at once.
		var leaked []string
		for i := -1; i < crowd; i++ {
			host := "first.test"
			if i >= 0 {
				host = fmt.Sprintf("c%d.test", i)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := do(ctx, host)
			cancel()
			if !errors.Is(err, ErrHostPaused) {
				leaked = append(leaked, host)
			}
		}
		if len(leaked) > 0 {
			t.Errorf("%d of %d parked hosts were sent a request (%d attempts), e.g. %q",
				len(leaked), crowd+1, sent.Load(), leaked[:min(3, len(leaked))])
		}
	})
}
