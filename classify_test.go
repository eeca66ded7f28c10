package retryhttp

// Issue 18: the services' dialects of "try again", as the classification
// reads them (R17), then through the Transport on a virtual clock.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestShouldRetryHeader(t *testing.T) {
	type said struct{ Retry, Said bool }
	for v, want := range map[string]said{
		"true": {true, true}, "false": {false, true}, "TRUE": {true, true}, " False ": {false, true},
		"": {}, "yes": {}, "1": {}, "0": {}, "true, false": {},
	} {
		h := http.Header{}
		if v != "" {
			h.Set("x-should-retry", v)
		}
		retry, ok := shouldRetryHeader(h)
		if diff := cmp.Diff(want, said{retry, ok}); diff != "" {
			t.Errorf("X-Should-Retry %q (-want +got):\n%s", v, diff)
		}
	}
}

// The default classification of responses: the statuses, 529 and
// Cloudflare's 520-523, the 403 that refuses for a quota, and the server's
// own X-Should-Retry.
func TestDefaultClassification(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	tests := []struct {
		name   string
		status int
		h      http.Header
		want   bool
	}{
		{"529 overloaded", 529, nil, true},
		{"520 unknown origin answer", 520, nil, true},
		{"521 origin down", 521, nil, true},
		{"522 origin timed out", 522, nil, true},
		{"523 origin unreachable", 523, nil, true},
		{"524 origin took over 100 s", 524, nil, false},
		{"525 TLS handshake with the origin", 525, nil, false},
		{"403 primary rate limit", 403, header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(2*time.Second)), true},
		{"403 secondary rate limit", 403, header("Retry-After", "60"), true},
		{"403 Retry-After of a second", 403, header("Retry-After", "1"), true},
		{"403 retry-after-ms of a second", 403, header("retry-after-ms", "1000"), true},
		{"403 retry-after-ms under a second", 403, header("retry-after-ms", "999"), false},
		{"403 Retry-After: 0 (seed 000)", 403, header("Retry-After", "0"), false},
		{"403 Retry-After date in the past", 403, header("Retry-After", now.Add(-time.Minute).Format(http.TimeFormat)), false},
		{"403 quota left", 403, header("X-RateLimit-Remaining", "10", "X-RateLimit-Reset", epoch(time.Minute)), false},
		{"403 quota spent, no reset", 403, header("X-RateLimit-Remaining", "0"), false},
		{"403 OpenAI quota spent", 403, header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "3s"), true},
		{"403 plain", 403, nil, false},
		{"401 with a Retry-After", 401, header("Retry-After", "60"), false},
		{"x-should-retry: true on a 409", 409, header("x-should-retry", "true"), true},
		{"x-should-retry: true on a 400", 400, header("x-should-retry", "true"), true},
		{"x-should-retry: false on a 503", 503, header("x-should-retry", "false"), false},
		{"x-should-retry: false on a 500", 500, header("x-should-retry", "false"), false},
		{"x-should-retry: false on a 403 refusal", 403, header("Retry-After", "5", "x-should-retry", "false"), false},
		{"x-should-retry: true on a 200", 200, header("x-should-retry", "true"), false},
		{"x-should-retry: maybe", 503, header("x-should-retry", "maybe"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: tt.status, Header: tt.h}
			if resp.Header == nil {
				resp.Header = http.Header{}
			}
			if got := worthRetrying(resp, &defaultStatusSet, now); got != tt.want {
				t.Errorf("worthRetrying = %v, want %v", got, tt.want)
			}
			if got := DefaultRetryIf(resp, nil); got != tt.want {
				t.Errorf("DefaultRetryIf = %v, want %v", got, tt.want)
			}
		})
	}
}

// R17 through the Transport: each service's way of naming a wait, on a 429
// or a 503, makes the retry wait exactly that (above the floor), counted on
// the virtual clock.
func TestServerNamedWaits(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		headers func(now time.Time) map[string]string
		tries   []float64 // seconds since the start at which the stub was asked
	}{
		{"retry-after-ms beside a coarser Retry-After", 429, constHeaders("retry-after-ms", "3000", "Retry-After", "1"), []float64{0, 3}},
		{"x-ms-retry-after-ms", 503, constHeaders("x-ms-retry-after-ms", "3000"), []float64{0, 3}},
		{"fractional Retry-After, rounded up", 503, constHeaders("Retry-After", "2.5"), []float64{0, 3}},
		{"retry-after-ms under the floor waits the floor", 429, constHeaders("retry-after-ms", "20"), []float64{0, 1}},
		{"OpenAI requests spent", 429, constHeaders("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "3s"), []float64{0, 3}},
		{"OpenAI tokens spent", 429, constHeaders("x-ratelimit-limit-tokens", "1000", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "3s"), []float64{0, 3}},
		{"Anthropic requests spent", 429, func(now time.Time) map[string]string {
			return map[string]string{"anthropic-ratelimit-requests-remaining": "0",
				"anthropic-ratelimit-requests-reset": now.Add(3 * time.Second).UTC().Format(time.RFC3339)}
		}, []float64{0, 3}},
		{"Anthropic 503 with tokens spent", 503, func(now time.Time) map[string]string {
			return map[string]string{"anthropic-ratelimit-tokens-remaining": "0",
				"anthropic-ratelimit-tokens-reset": now.Add(3 * time.Second).UTC().Format(time.RFC3339)}
		}, []float64{0, 3}},
		{"retry-after-ms beyond the max: handed back at once", 429, constHeaders("retry-after-ms", "120000", "Retry-After", "1"), []float64{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/": {{status: tt.status, headers: tt.headers(time.Now())}, {status: 200}}})
				net := newPipeNet(host)
				defer net.close()
				var ev events
				tr := New(WithBase(net.tr), WithLearning(false), fixedRand(0), onEvents(ev.add))
				code, _ := get(t, tr, "http://llm.test/")
				if diff := cmp.Diff(tt.tries, host.seconds()); diff != "" {
					t.Errorf("tries (-want +got):\n%s", diff)
				}
				if want := map[bool]int{true: 200, false: tt.status}[len(tt.tries) > 1]; code != want {
					t.Errorf("status %d, want %d", code, want)
				}
				if len(tt.tries) == 1 {
					if diff := cmp.Diff([]Reason{ReasonServerWait}, reasons(ev.list())); diff != "" {
						t.Errorf("reasons (-want +got):\n%s", diff)
					}
					if _, err := send(tr, http.MethodGet, "http://llm.test/", "", nil); !errors.Is(err, ErrHostPaused) {
						t.Errorf("next request: %v, want ErrHostPaused", err)
					}
				}
			})
		})
	}
}

// constHeaders returns headers that do not depend on the time.
func constHeaders(kv ...string) func(time.Time) map[string]string {
	return func(time.Time) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
}

// R17: X-Should-Retry is the server's word. "false" is final, whatever the
// status or a predicate; "true" makes a failure worth retrying and, for a
// POST, safe to repeat.
func TestShouldRetryThroughTransport(t *testing.T) {
	always := func(*http.Response, error) bool { return true }
	tests := []struct {
		name    string
		method  string
		opts    []Option
		script  []step
		want    []int // the statuses the stub answered
		reasons []Reason
	}{
		{"false on a 503 GET is final", "GET", nil, []step{{status: 503, headers: map[string]string{"x-should-retry": "false"}}}, []int{503}, nil},
		{"false on a 500 GET is final", "GET", nil, []step{{status: 500, headers: map[string]string{"x-should-retry": "false"}}}, []int{500}, nil},
		{"false beats a predicate", "GET", []Option{WithRetryIf(always)}, []step{{status: 503, headers: map[string]string{"x-should-retry": "false"}}}, []int{503}, nil},
		{"false on a 429 is final", "GET", nil, []step{{status: 429, headers: map[string]string{"x-should-retry": "false", "Retry-After": "1"}}}, []int{429}, nil},
		{"true on a 409 GET", "GET", nil, []step{{status: 409, headers: map[string]string{"x-should-retry": "true"}}, {status: 200}}, []int{409, 200}, []Reason{""}},
		{"true on a 409 POST: the server vouches", "POST", nil, []step{{status: 409, headers: map[string]string{"x-should-retry": "true"}}, {status: 200}}, []int{409, 200}, []Reason{""}},
		{"true on a 500 POST: the server vouches", "POST", nil, []step{{status: 500, headers: map[string]string{"x-should-retry": "true"}}, {status: 200}}, []int{500, 200}, []Reason{""}},
		{"true still counts the attempts", "GET", nil, []step{{status: 409, headers: map[string]string{"x-should-retry": "true"}}}, []int{409, 409, 409},
			[]Reason{"", "", ReasonAttempts}},
		{"a 500 POST without it is sent once", "POST", nil, []step{{status: 500}}, []int{500}, []Reason{ReasonNotIdempotent}},
		{"a predicate that says no to a true", "GET", []Option{WithRetryIf(func(*http.Response, error) bool { return false })},
			[]step{{status: 409, headers: map[string]string{"x-should-retry": "true"}}}, []int{409}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/v1/chat/completions": tt.script})
				net := newPipeNet(host)
				defer net.close()
				var ev events
				tr := New(append([]Option{WithBase(net.tr), WithLearning(false), fixedRand(0), onEvents(ev.add)}, tt.opts...)...)
				resp, err := send(tr, tt.method, "http://llm.test/v1/chat/completions", `{"model":"m"}`, nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if diff := cmp.Diff(tt.want, answered(host, tt.script)); diff != "" {
					t.Errorf("answers (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tt.reasons, reasons(ev.list())); diff != "" {
					t.Errorf("reasons (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// answered lists the statuses a stub answered with one script, in order.
func answered(host *stub, script []step) []int {
	var out []int
	for i := range host.all() {
		out = append(out, script[min(i, len(script)-1)].status)
	}
	return out
}

// R17: a 403 that refuses for a quota is a refusal, retried after the wait
// when it fits the max, GitHub's POSTs included (a refusal says the server
// did nothing), and parked beyond it; a 403 that names no such wait stays
// final, seed 000's Retry-After: 0 among them.
func TestForbiddenRefusal(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		opts    []Option
		headers func(now time.Time) map[string]string
		body    string
		tries   []float64
		parked  bool
	}{
		{"primary rate limit, reset 2 s away", "GET", nil, func(now time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(now.Add(2*time.Second).Unix(), 10)}
		}, `{"message": "API rate limit exceeded"}`, []float64{0, 2}, false},
		{"secondary rate limit on a POST", "POST", nil, constHeaders("Retry-After", "3"),
			`{"message": "You have exceeded a secondary rate limit", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`,
			[]float64{0, 3}, false},
		{"primary rate limit, reset an hour away", "GET", nil, func(now time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(now.Add(time.Hour).Unix(), 10)}
		}, `{"message": "API rate limit exceeded"}`, []float64{0}, true},
		{"seed 000: Retry-After: 0 and an empty body", "GET", nil, constHeaders("Retry-After", "0"), "", []float64{0}, false},
		{"no rate-limit headers", "GET", nil, constHeaders(), `{"message": "Must have admin rights"}`, []float64{0}, false},
		{"not while 429 is not retried", "GET", []Option{WithRetryStatuses(503)}, constHeaders("Retry-After", "3"), "", []float64{0}, false},
		{"every 403 when asked for", "GET", []Option{WithRetryStatuses(403), WithMaxAttempts(2)}, constHeaders(), "", []float64{0, 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/repos/o/r/issues": {{status: 403, headers: tt.headers(time.Now()), body: tt.body}, {status: 200, body: "[]"}}})
				net := newPipeNet(host)
				defer net.close()
				tr := New(append([]Option{WithBase(net.tr), fixedRand(0)}, tt.opts...)...)
				resp, err := send(tr, tt.method, "http://api.github.test/repos/o/r/issues", "{}", nil)
				if err != nil {
					t.Fatal(err)
				}
				body := readAll(resp)
				if diff := cmp.Diff(tt.tries, host.seconds()); diff != "" {
					t.Errorf("tries (-want +got):\n%s", diff)
				}
				if last := len(tt.tries) == 1; last && (resp.StatusCode != 403 || body != tt.body) {
					t.Errorf("%d %q, want the 403 whole", resp.StatusCode, body)
				}
				next, err := send(tr, http.MethodGet, "http://api.github.test/", "", nil)
				if err == nil {
					next.Body.Close()
				}
				if got := errors.Is(err, ErrHostPaused); got != tt.parked {
					t.Errorf("next request: %v; parked %v, want %v", err, got, tt.parked)
				}
			})
		})
	}
}

// R2, R17: 529 is retried by default, and so are Cloudflare's 520-523 but
// not its 524; WithExtraRetryStatuses adds to the set without restating it.
func TestRetryStatusesDialects(t *testing.T) {
	tests := []struct {
		status int
		method string
		opts   []Option
		want   int // requests that reach the server
	}{
		{529, "GET", nil, 3}, {520, "GET", nil, 3}, {521, "GET", nil, 3}, {522, "GET", nil, 3}, {523, "GET", nil, 3},
		{524, "GET", nil, 1}, {529, "POST", nil, 1}, {522, "POST", nil, 1},
		{409, "GET", []Option{WithExtraRetryStatuses(409)}, 3},
		{503, "GET", []Option{WithExtraRetryStatuses(409)}, 3},
		{529, "GET", []Option{WithExtraRetryStatuses(409)}, 3},
		{524, "GET", []Option{WithExtraRetryStatuses(524, 999)}, 3},
		{409, "GET", []Option{WithExtraRetryStatuses()}, 1},
		{409, "GET", []Option{WithRetryStatuses(500), WithExtraRetryStatuses(409)}, 3},
		{503, "GET", []Option{WithRetryStatuses(500), WithExtraRetryStatuses(409)}, 1},
		{409, "GET", []Option{WithExtraRetryStatuses(409), WithRetryStatuses(500)}, 1},
		{409, "GET", []Option{WithExtraRetryStatuses(409), WithExtraRetryStatuses(410)}, 3},
		{410, "GET", []Option{WithExtraRetryStatuses(409), WithExtraRetryStatuses(410)}, 3},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: tt.status}}})
			net := newPipeNet(host)
			defer net.close()
			tr := New(append([]Option{WithBase(net.tr), WithBudget(nil)}, tt.opts...)...)
			resp, err := send(tr, tt.method, "http://x.test/", "body", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := host.count(""); got != tt.want {
				t.Errorf("%s answered %d with %d options: %d requests, want %d", tt.method, tt.status, len(tt.opts), got, tt.want)
			}
		})
	}
	// The defaults are not changed by a Transport that added to them.
	New(WithExtraRetryStatuses(409))
	if defaultStatusSet.has(409) || len(defaultStatuses) != 11 {
		t.Errorf("WithExtraRetryStatuses changed the defaults: %v", defaultStatuses)
	}
}

// R3, R17: what the caller says is safe to repeat, through the context or
// the Transport, is retried after a failure that may have reached the
// server; nothing else is.
func TestSafeToRepeat(t *testing.T) {
	completions := func(r *http.Request) bool { return r.URL.Path == "/v1/chat/completions" }
	safe := ContextWithPolicy(context.Background(), PolicySafeToRepeat())
	tests := []struct {
		name  string
		ctx   context.Context
		opts  []Option
		path  string
		tries int
	}{
		{"an unkeyed POST, by default", context.Background(), nil, "/v1/chat/completions", 1},
		{"the context says so", safe, nil, "/v1/chat/completions", 3},
		{"a nested policy keeps it", ContextWithPolicy(safe, PolicyMaxAttempts(4)), nil, "/v1/chat/completions", 4},
		{"the Transport's predicate says so", context.Background(), []Option{WithSafeToRepeat(completions)}, "/v1/chat/completions", 3},
		{"the predicate says nothing of another path", context.Background(), []Option{WithSafeToRepeat(completions)}, "/v1/files", 1},
		{"predicates add up", context.Background(), []Option{WithSafeToRepeat(completions), WithSafeToRepeat(nil),
			WithSafeToRepeat(func(r *http.Request) bool { return r.URL.Path == "/v1/files" })}, "/v1/files", 3},
		{"safe, but retries off", ContextWithPolicy(safe, PolicyNoRetry()), nil, "/v1/chat/completions", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{tt.path: {{status: 503}}})
				net := newPipeNet(host)
				defer net.close()
				tr := New(append([]Option{WithBase(net.tr), WithBudget(nil), WithLearning(false)}, tt.opts...)...)
				resp, err := sendCtx(tt.ctx, tr, http.MethodPost, "http://llm.test"+tt.path, `{"model":"m"}`, nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				hits := host.all()
				if len(hits) != tt.tries {
					t.Errorf("%d tries, want %d", len(hits), tt.tries)
				}
				for i, h := range hits {
					if h.body != `{"model":"m"}` {
						t.Errorf("try %d sent %q", i+1, h.body)
					}
				}
			})
		})
	}
}

// R3: a POST said to be safe to repeat is sent again even after its
// connection died once the server had read it; without the word, once.
func TestSafeToRepeatAfterReset(t *testing.T) {
	var executed atomic.Int32
	srv := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		executed.Add(1)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	for _, tc := range []struct {
		ctx  context.Context
		want int32
	}{
		{context.Background(), 1},
		{ContextWithPolicy(context.Background(), PolicySafeToRepeat()), 3},
	} {
		executed.Store(0)
		tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
		if _, err := sendCtx(tc.ctx, tr, http.MethodPost, srv.URL, strings.Repeat("q", 100), nil); err == nil {
			t.Fatal("no error from a connection closed without an answer")
		}
		if got := executed.Load(); got != tc.want {
			t.Errorf("executed %d times, want %d", got, tc.want)
		}
	}
}
