package retryhttp

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// BenchmarkRoundTripOthersHold is the success path of a host without a
// record while 1,000 other hosts hold one (each answered one 503): issue
// 26's third row, which should cost what a host costs when none does.
// (b.Loop runs the function once: the sleep below is paid once a count.)
func BenchmarkRoundTripOthersHold(b *testing.B) {
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host != "api.test" {
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}
		return memBase{}.RoundTrip(r)
	})))
	ctx := ContextWithPolicy(context.Background(), PolicyNoRetry())
	for i := range 1000 {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h"+strconv.Itoa(i)+".test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 503 {
			b.Fatalf("warm-up: %v %v", resp, err)
		}
	}
	// Past the hold of the newest record: until then every answer is
	// told to the records, in case it is of a burst they must hear of.
	time.Sleep(holdTime + 100*time.Millisecond)
	get, _ := http.NewRequest("GET", "http://api.test/v1/x", nil)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := tr.RoundTrip(get)
		if err != nil || resp.StatusCode != 200 {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmitOthersHold is the admission alone of a host without a
// record while 1,000 other hosts hold one.
func BenchmarkAdmitOthersHold(b *testing.B) {
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})))
	ctx := ContextWithPolicy(context.Background(), PolicyNoRetry())
	for i := range 1000 {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h"+strconv.Itoa(i)+".test/", nil)
		if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != 503 {
			b.Fatalf("warm-up: %v %v", resp, err)
		}
	}
	bg := context.Background()
	host := ""
	for i := 0; host == ""; i++ {
		h := "free" + strconv.Itoa(i) + ".test"
		if res, _ := tr.limiter.Reserve(bg, Attempt{Host: h, Pace: Pace{Limit: rate.Inf}, Now: time.Now()}); res.OK {
			host = h
		}
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if !tr.admitted(now) {
			if _, err := tr.admit(bg, host, now); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkSweepFullShard is what the request that runs a step of the
// time sweep pays at most: a shard at its bound, every record live.
func BenchmarkSweepFullShard(b *testing.B) {
	l := newLocalLimiter(realClock{})
	now := time.Now()
	for i := 0; len(l.shards[0].hosts) < l.perShard; i++ {
		h := "s" + strconv.Itoa(i) + ".test"
		if shardOf(hostHash(h)) == 0 {
			l.Learn(context.Background(), h, Signal{Now: now, Status: http.StatusInternalServerError, Reset: -1, Remaining: -1})
		}
	}
	s := &l.shards[0]
	b.ReportAllocs()
	for b.Loop() {
		s.mu.Lock()
		s.sweep(l, now, false)
		s.mu.Unlock()
	}
	if len(s.hosts) != l.perShard {
		b.Fatalf("%d hosts left of %d", len(s.hosts), l.perShard)
	}
}
