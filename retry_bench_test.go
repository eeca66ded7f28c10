package retryhttp

import (
	"net/http"
	"sync/atomic"
	"testing"
)

// BenchmarkRetry is issue 26's retry row on the core: every request is
// answered 503, then 200 on its retry, with a zero jitter so that the
// retry waits nothing; learning on (the defaults) and off. Over the
// in-memory base, and over a plain *http.Transport in front of it.
func BenchmarkRetry(b *testing.B) {
	get, _ := http.NewRequest("GET", "http://api.test/v1/x", nil)
	memGet, _ := http.NewRequest("GET", "mem://api.test/v1/x", nil)
	zero := WithRand(func() float64 { return 0 })
	for _, bc := range []struct {
		name string
		opts []Option
		req  *http.Request
		tr   bool
	}{
		{"learn", nil, get, false},
		{"nolearn", []Option{WithLearning(false)}, get, false},
		{"transport-learn", nil, memGet, true},
		{"transport-nolearn", []Option{WithLearning(false)}, memGet, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var base http.RoundTripper = everyOther503()
			if bc.tr {
				tr := &http.Transport{}
				tr.RegisterProtocol("mem", base)
				base = tr
			}
			rt := New(append([]Option{WithBase(base), zero}, bc.opts...)...)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rt.RoundTrip(bc.req)
				if err != nil || resp.StatusCode != 200 {
					b.Fatal(resp, err)
				}
			}
		})
	}
}

// everyOther503 answers 503 naming no wait, then 200, and so on.
func everyOther503() http.RoundTripper {
	var n atomic.Int64
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if n.Add(1)%2 == 1 {
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}
		return memBase{}.RoundTrip(r)
	})
}
