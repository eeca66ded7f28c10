package retryhttp

import (
	"context"
	"net/http"
	"strconv"
	"testing"
)

// BenchmarkRoundTripOthersHold is the success path of a host without a
// record while 1,000 other hosts hold one (each answered one 503): issue
// 26's third row, which should cost what a host costs when none does.
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
	get, _ := http.NewRequest("GET", "http://api.test/v1/x", nil)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := tr.RoundTrip(get)
		if err != nil || resp.StatusCode != 200 {
			b.Fatal(err)
		}
	}
}
