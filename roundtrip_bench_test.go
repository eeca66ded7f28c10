package retryhttp

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// memBase answers every request 200 from memory: what the decorators add
// to a round trip, without the network's noise.
type memBase struct{}

func (memBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// BenchmarkRoundTrip is the success path: the bare in-memory base, and the
// same through a Transport with the defaults, GET and POST; and a GET to a
// host that holds a record (one 503 earlier), against one that does not.
func BenchmarkRoundTrip(b *testing.B) {
	get, _ := http.NewRequest("GET", "http://api.test/v1/x", nil)
	post, _ := http.NewRequest("POST", "http://api.test/v1/x", strings.NewReader(strings.Repeat("x", 1024)))
	// The same in-memory base behind a plain *http.Transport (the scheme
	// "mem" goes straight to it): the default configuration's kind of
	// base, which needs no nesting mark.
	tr := &http.Transport{}
	tr.RegisterProtocol("mem", memBase{})
	memGet, _ := http.NewRequest("GET", "mem://api.test/v1/x", nil)
	for _, bc := range []struct {
		name string
		rt   http.RoundTripper
		req  *http.Request
	}{
		{"GET/bare", memBase{}, get},
		{"GET/retryhttp", New(WithBase(memBase{})), get},
		{"GET/bare-transport", tr, memGet},
		{"GET/retryhttp-transport", New(WithBase(tr)), memGet},
		{"GET/retryhttp-nested-mark", New(WithBase(&countingBase{base: memBase{}})), get},
		{"GET/retryhttp-record", withRecord(b, get), get},
		{"GET/retryhttp-quota", New(WithBase(quotaBase{})), get},
		// A pace that never waits: at 1e6 a second this loop, a few
		// hundred ns an op, outran its burst and timed its waits (about
		// 1 µs an op where the path takes 330-500 ns).
		{"GET/retryhttp-pace", New(WithBase(memBase{}), WithPace(1e9, 1000)), get},
		{"GET/retryhttp-transport-pace", New(WithBase(tr), WithPace(1e9, 1000)), memGet},
		{"POST/bare", memBase{}, post},
		{"POST/retryhttp", New(WithBase(memBase{})), post},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := bc.rt.RoundTrip(bc.req)
				if err != nil || resp.StatusCode != 200 {
					b.Fatal(err)
				}
			}
		})
	}
}

// quotaBase answers every request 200 announcing a quota of a million a
// second: the model learns it and paces at it, never waiting.
type quotaBase struct{}

func (quotaBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{
		"X-Ratelimit-Limit":     {"1000000"},
		"X-Ratelimit-Remaining": {"999999"},
		"X-Ratelimit-Reset":     {"1"},
	}, Body: http.NoBody, Request: req}, nil
}

// withRecord returns a Transport with the defaults whose host of req
// answered one 503 (not retried): the host holds a record of the model
// for the next minute.
func withRecord(b *testing.B, req *http.Request) *Transport {
	var once atomic.Bool
	tr := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if once.CompareAndSwap(false, true) {
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}
		return memBase{}.RoundTrip(r)
	})))
	resp, err := tr.RoundTrip(req.WithContext(ContextWithPolicy(context.Background(), PolicyNoRetry())))
	if err != nil || resp.StatusCode != 503 {
		b.Fatalf("warm-up: %v %v", resp, err)
	}
	return tr
}
