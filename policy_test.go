package retryhttp

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A policy on the request's context changes that request's attempts and
// classification, within the safety rules.
func TestContextWithPolicy(t *testing.T) {
	conflict := func(resp *http.Response, err error) bool {
		return resp != nil && resp.StatusCode == http.StatusConflict
	}
	always := func(*http.Response, error) bool { return true }
	cases := []struct {
		name     string
		method   string
		path     string
		opts     []Option
		policy   [][]PolicyOption // one ContextWithPolicy per element, nested
		attempts int
		reasons  []Reason
	}{
		{name: "none", path: "/503", attempts: 3, reasons: []Reason{"", "", ReasonAttempts}},
		{name: "more attempts", path: "/503", policy: [][]PolicyOption{{PolicyMaxAttempts(5)}}, attempts: 5,
			reasons: []Reason{"", "", "", "", ReasonAttempts}},
		{name: "no retry", path: "/503", policy: [][]PolicyOption{{PolicyNoRetry()}}, attempts: 1},
		{name: "attempts below 1 mean the Transport's", path: "/503", policy: [][]PolicyOption{{PolicyMaxAttempts(-4)}}, attempts: 3,
			reasons: []Reason{"", "", ReasonAttempts}},
		{name: "retries on for one request", path: "/503", opts: []Option{WithMaxAttempts(1)},
			policy: [][]PolicyOption{{PolicyMaxAttempts(2)}}, attempts: 2, reasons: []Reason{"", ReasonAttempts}},
		{name: "own predicate", path: "/409", policy: [][]PolicyOption{{PolicyRetryIf(conflict)}}, attempts: 3,
			reasons: []Reason{"", "", ReasonAttempts}},
		{name: "nil predicate means the Transport's", path: "/409", policy: [][]PolicyOption{{PolicyRetryIf(nil)}}, attempts: 1},
		{name: "a predicate cannot make a POST safe", method: http.MethodPost, path: "/503",
			policy: [][]PolicyOption{{PolicyRetryIf(always)}}, attempts: 1, reasons: []Reason{ReasonNotIdempotent}},
		{name: "nested policies add up", path: "/409",
			policy:   [][]PolicyOption{{PolicyMaxAttempts(4)}, {PolicyRetryIf(conflict)}},
			attempts: 4, reasons: []Reason{"", "", "", ReasonAttempts}},
		{name: "the inner policy wins", path: "/503",
			policy:   [][]PolicyOption{{PolicyMaxAttempts(4)}, {PolicyNoRetry(), nil}},
			attempts: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/503": {{status: 503}}, "/409": {{status: 409}}})
				net := newPipeNet(host)
				defer net.close()
				var ev events
				tr := New(append([]Option{WithBase(net.tr), WithBudget(nil), WithLearning(false), onEvents(ev.add)}, c.opts...)...)
				ctx := context.Background()
				for _, p := range c.policy {
					ctx = ContextWithPolicy(ctx, p...)
				}
				method := c.method
				if method == "" {
					method = http.MethodPut
				}
				// A body without GetBody: a policy that turns retries on
				// must also keep the copy a retry sends.
				req, _ := http.NewRequestWithContext(ctx, method, "http://x.test"+c.path, io.NopCloser(strings.NewReader("payload")))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				hits := host.all()
				if len(hits) != c.attempts {
					t.Errorf("%d attempts, want %d", len(hits), c.attempts)
				}
				for i, h := range hits {
					if h.body != "payload" {
						t.Errorf("attempt %d sent %q", i+1, h.body)
					}
				}
				var reasons []Reason
				for _, e := range ev.list() {
					reasons = append(reasons, e.Reason)
				}
				if diff := cmp.Diff(c.reasons, reasons); diff != "" {
					t.Errorf("event reasons (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// Hooks add up, and a parking is reported with its host and end.
func TestHooksAddUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/": {{status: 429, headers: map[string]string{"Retry-After": "2"}}, {status: 200}}})
		net := newPipeNet(host)
		defer net.close()
		var first, second []int
		var parks []ParkEvent
		start := time.Now()
		tr := New(WithBase(net.tr),
			WithOnRetry(func(e RetryEvent) { first = append(first, e.Attempt) }),
			WithOnRetry(nil),
			WithOnRetry(func(e RetryEvent) { second = append(second, e.Attempt) }),
			WithOnPark(func(e ParkEvent) { parks = append(parks, e) }))
		resp, err := send(tr, http.MethodGet, "http://X.test:80/", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if diff := cmp.Diff([]int{1}, first); diff != "" {
			t.Errorf("first hook (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(first, second); diff != "" {
			t.Errorf("second hook (-first +second):\n%s", diff)
		}
		if len(parks) != 1 {
			t.Fatalf("%d park events, want 1", len(parks))
		}
		p := parks[0]
		if p.Host != "x.test" || p.Status != 429 || !p.Until.Equal(start.Add(2*time.Second)) || p.Request == nil {
			t.Errorf("park event %+v, want x.test parked 2s by a 429", p)
		}
	})
}
