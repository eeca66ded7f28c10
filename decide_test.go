package retryhttp

// Issue 9: one retry decision. A regression test for each defect found in
// review, named for it, then the decision opened to users (WithRetryIf,
// DefaultRetryIf, PeekBody, the Reason constants) and host keys.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Defect 1: when a retry cannot be admitted (its pace slot comes after the
// deadline, or its host was parked beyond the max meanwhile), the caller
// gets the last response, body unread, not an error.
func TestRetryNotAdmittedKeepsLastResponse(t *testing.T) {
	t.Run("pace slot after the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: 503, body: "busy"}}})
			net := newPipeNet(host)
			defer net.close()
			var ev events
			tr := New(WithBase(net.tr), WithPace(1, 1), WithBackoff(time.Nanosecond, time.Nanosecond),
				fixedRand(0), onEvents(ev.add))
			ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
			defer cancel()
			resp, err := sendCtx(ctx, tr, http.MethodGet, "http://api.test/", "", nil)
			if err != nil {
				t.Fatalf("error %v (ctx.Err() %v), want the 503", err, ctx.Err())
			}
			if resp.StatusCode != 503 || readAll(resp) != "busy" {
				t.Errorf("status %d, want the 503 with its body", resp.StatusCode)
			}
			if diff := cmp.Diff([]Reason{ReasonDeadline}, reasons(ev.list())); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if n := host.count(""); n != 1 {
				t.Errorf("%d requests sent, want 1", n)
			}
		})
	})
	t.Run("host parked beyond the max while backing off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{
				"/a": {{status: 503, body: "a is busy"}},
				"/b": {{status: 429, headers: map[string]string{"Retry-After": "120"}}},
			})
			net := newPipeNet(host)
			defer net.close()
			var ev events
			tr := New(WithBase(net.tr), WithBackoff(time.Second, time.Second), fixedRand(0.99), onEvents(ev.add))
			var wg sync.WaitGroup
			var status int
			var body string
			var aerr error
			wg.Go(func() {
				resp, err := send(tr, http.MethodGet, "http://api.test/a", "", nil)
				if aerr = err; err == nil {
					status, body = resp.StatusCode, readAll(resp)
				}
			})
			time.Sleep(100 * time.Millisecond) // /a is backing off
			if code, _ := get(t, tr, "http://api.test/b"); code != 429 {
				t.Errorf("/b: %d, want its 429 at once", code)
			}
			wg.Wait()
			if aerr != nil || status != 503 || body != "a is busy" {
				t.Errorf("/a: %d %q, error %v; want its 503 whole", status, body, aerr)
			}
			if got := reasons(ev.list()); !contains(got, ReasonHostPaused) {
				t.Errorf("reasons %v, want one saying %q", got, ReasonHostPaused)
			}
		})
	})
}

// Defect 2: a stalled body of a retried response never holds the retry
// beyond the drain bound, whatever the base (here a wrapper around
// net/http's Transport, as otelhttp or a logging RoundTripper would be).
func TestDrainBoundedWhateverTheBase(t *testing.T) {
	stall := make(chan struct{})
	defer close(stall)
	var tries sync.Map
	srv := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, again := tries.LoadOrStore("x", true); again {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(503)
		io.WriteString(w, "ten bytes.")
		w.(http.Flusher).Flush()
		select { // the rest never comes, until the test ends
		case <-stall:
		case <-r.Context().Done():
		}
	}))
	for _, tc := range []struct {
		name string
		base func() http.RoundTripper
	}{
		{"wrapper", func() http.RoundTripper { return &countingBase{base: &http.Transport{}} }},
		{"nested Transport", func() http.RoundTripper { return New(WithBase(&http.Transport{})) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tries.Delete("x")
			tr := New(WithBase(tc.base()), WithBackoff(time.Millisecond, time.Millisecond), WithLearning(false))
			start := time.Now()
			code, body := get(t, tr, srv.URL)
			// The bound is 50 ms; a hang is the test's 10-minute timeout.
			if took := time.Since(start); code != 200 || body != "ok" || took > 5*time.Second {
				t.Errorf("%d %q after %v, want the retry's 200 within the drain bound", code, body, took)
			}
		})
	}
}

// Defect 3: a first try is counted in the second it is made, and a late
// count never overwrites the bucket of a later second.
func TestBudgetLateFirstTry(t *testing.T) {
	b := NewBudget(0.1, 0)
	t100 := time.Unix(1_000_100, 0)
	for range 10 {
		b.recordFirst(t100)
	}
	b.recordFirst(t100.Add(-10 * time.Second)) // the same bucket, ten seconds stale
	if !b.tryRetry(t100) {
		t.Error("ten first tries at 10 % allow a retry; a stale count overwrote them")
	}
	synctest.Test(t, func(t *testing.T) {
		// Through the Transport: a request parked 20 s counts its first try
		// when it is sent, inside the window of its retry.
		host := newStub(map[string][]step{
			"/park": {{status: 503, headers: map[string]string{"Retry-After": "20"}}, {status: 200}},
			"/late": {{status: 503}, {status: 200}},
		})
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr), WithBudget(NewBudget(0.1, 0)), WithMaxAttempts(1), fixedRand(0))
		get(t, tr, "http://api.test/park") // parks the host for 20 s
		tr2 := New(WithBase(net.tr), WithBudget(tr.budget), WithLimiter(tr.limiter), fixedRand(0), WithLearning(false))
		var wg sync.WaitGroup
		for range 9 {
			wg.Go(func() { get(t, tr2, "http://api.test/other") })
		}
		wg.Wait()
		if code, _ := get(t, tr2, "http://api.test/late"); code != 200 {
			t.Errorf("/late: %d; its retry was refused by a budget that missed the first tries", code)
		}
	})
}

// Defect 4: a Transport nested below another declines to send when its
// pace slot is past the deadline; the outer one does not retry that.
func TestOuterDoesNotRetryInnerPacingRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(nil)
		net := newPipeNet(host)
		defer net.close()
		inner := New(WithBase(net.tr), WithPace(1, 1))
		for _, outerBase := range []http.RoundTripper{inner, &countingBase{base: inner}} {
			var ev events
			outer := New(WithBase(outerBase), onEvents(ev.add))
			before := host.count("")
			get(t, outer, "http://api.test/") // takes the one token
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err := sendCtx(ctx, outer, http.MethodGet, "http://api.test/", "", nil)
			cancel()
			var re *RetryError
			if !errors.As(err, &re) || re.Attempts != 1 || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%T: error %v, want the pacing refusal after 1 attempt", outerBase, err)
			}
			if n := host.count("") - before; n != 1 || len(ev.list()) != 0 {
				t.Errorf("%T: %d sent, events %+v; want 1 and none", outerBase, n, ev.list())
			}
			time.Sleep(2 * time.Second) // the next round starts with a token
		}
	})
}

// Defect 5: a malformed address is tried once.
func TestMalformedAddressNotRetried(t *testing.T) {
	var ev events
	tr := New(WithBackoff(time.Millisecond, time.Millisecond), onEvents(ev.add))
	_, err := send(tr, http.MethodGet, "http://127.0.0.1:99999/", "", nil)
	var re *RetryError
	if !errors.As(err, &re) || re.Attempts != 1 || len(ev.list()) != 0 {
		t.Errorf("error %v, events %v; want one attempt and no retry", err, ev.list())
	}
}

// Defect 6: only the request a Transport passes down is nested for it. A
// base that makes calls of its own with the request's context, through an
// independent retrying client (an auth wrapper fetching a token), gets
// retries there.
func TestNestingMarkDoesNotLeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/token": {{status: 503}, {status: 200, body: "t0k3n"}}})
		net := newPipeNet(host)
		defer net.close()
		tokens := New(WithBase(net.tr), fixedRand(0))
		auth := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://auth.test/token", nil)
			resp, err := tokens.RoundTrip(req)
			if err != nil {
				return nil, err
			}
			tok := readAll(resp)
			r2 := r.Clone(r.Context())
			r2.Header.Set("Authorization", "Bearer "+tok)
			return net.tr.RoundTrip(r2)
		})
		tr := New(WithBase(auth), fixedRand(0))
		if code, _ := get(t, tr, "http://api.test/data"); code != 200 {
			t.Errorf("status %d, want 200", code)
		}
		if n := host.count("/token"); n != 2 {
			t.Errorf("token endpoint asked %d times, want 2: its 503 retried", n)
		}
	})
}

// The success path's and the nested path's parking agree: a zero wait
// parks the host in neither.
func TestZeroWaitParksNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/": {{status: 503, headers: map[string]string{"Retry-After": "0"}}, {status: 200}}})
		net := newPipeNet(host)
		defer net.close()
		flat := New(WithBase(net.tr), WithLearning(false))
		inner := New(WithBase(net.tr), WithLearning(false))
		outer := New(WithBase(inner), WithLearning(false))
		for _, tc := range []struct {
			name string
			rt   *Transport
			l    *Transport
		}{{"flat", flat, flat}, {"nested", outer, inner}} {
			get(t, tc.rt, "http://api.test/")
			if p := tc.l.limiter.(*localLimiter).parkedUntil.Load(); p != 0 {
				t.Errorf("%s: the host was parked by a zero wait", tc.name)
			}
		}
	})
}

// WithRetryIf replaces what is worth retrying; the safety rules stay.
func TestRetryIf(t *testing.T) {
	conflictToo := func(resp *http.Response, err error) bool {
		return DefaultRetryIf(resp, err) || (resp != nil && resp.StatusCode == http.StatusConflict)
	}
	secondary := func(resp *http.Response, err error) bool {
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			return DefaultRetryIf(resp, err)
		}
		prefix, _ := PeekBody(resp, 64)
		return strings.Contains(string(prefix), "secondary rate limit")
	}
	long := "secondary rate limit" + strings.Repeat(".", 100_000)
	tests := []struct {
		name      string
		method    string
		pred      func(*http.Response, error) bool
		script    []step
		wantTries int
		wantCode  int
		wantBody  string
		reasons   []Reason
	}{
		{"409 added to the default", "GET", conflictToo, []step{{status: 409}, {status: 200, body: "ok"}}, 2, 200, "ok", nil},
		{"the default still retries 503", "GET", conflictToo, []step{{status: 503}, {status: 200, body: "ok"}}, 2, 200, "ok", nil},
		{"a POST is still not repeated", "POST", conflictToo, []step{{status: 409, body: "taken"}}, 1, 409, "taken", []Reason{ReasonNotIdempotent}},
		{"attempts still bound it", "GET", conflictToo, []step{{status: 409, body: "c"}}, 3, 409, "c", []Reason{ReasonAttempts}},
		{"a predicate reads the body, the caller gets it whole", "GET", secondary, []step{{status: 403, body: long}}, 3, 403, long, []Reason{ReasonAttempts}},
		{"a 403 without the words is final", "GET", secondary, []step{{status: 403, body: "no"}}, 1, 403, "no", nil},
		{"the predicate can say no to a 503", "GET", func(*http.Response, error) bool { return false }, []step{{status: 503, body: "x"}}, 1, 503, "x", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/": tt.script})
				net := newPipeNet(host)
				defer net.close()
				var ev events
				tr := New(WithBase(net.tr), WithRetryIf(tt.pred), fixedRand(0), onEvents(ev.add), WithLearning(false))
				resp, err := send(tr, tt.method, "http://api.test/", "body", nil)
				if err != nil {
					t.Fatal(err)
				}
				body := readAll(resp)
				if resp.StatusCode != tt.wantCode || body != tt.wantBody || host.count("/") != tt.wantTries {
					t.Errorf("%d (%d bytes) after %d tries, want %d (%d bytes) after %d",
						resp.StatusCode, len(body), host.count("/"), tt.wantCode, len(tt.wantBody), tt.wantTries)
				}
				var refused []Reason
				for _, r := range reasons(ev.list()) {
					if r != "" {
						refused = append(refused, r)
					}
				}
				if diff := cmp.Diff(tt.reasons, refused); diff != "" {
					t.Errorf("refusals (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestPeekBody(t *testing.T) {
	resp := &http.Response{Body: io.NopCloser(strings.NewReader("hello, world"))}
	got, err := PeekBody(resp, 5)
	if err != nil || string(got) != "hello" {
		t.Fatalf("PeekBody: %q, %v", got, err)
	}
	again, _ := PeekBody(resp, 7)
	rest, _ := io.ReadAll(resp.Body)
	if string(again) != "hello, " || string(rest) != "hello, world" {
		t.Errorf("second peek %q, then the body %q; want the whole body", again, rest)
	}
	if b, err := PeekBody(nil, 10); b != nil || err != nil {
		t.Errorf("PeekBody(nil) = %q, %v", b, err)
	}
	failing := &http.Response{Body: io.NopCloser(io.MultiReader(strings.NewReader("ab"), errReader{}))}
	if b, err := PeekBody(failing, 10); string(b) != "ab" || err == nil {
		t.Errorf("PeekBody of a failing body: %q, %v; want what was read and the error", b, err)
	}
	if b, err := io.ReadAll(failing.Body); string(b) != "ab" || err == nil {
		t.Errorf("after the peek: %q, %v; want the bytes, then the error again", b, err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestDefaultRetryIf(t *testing.T) {
	for code, want := range map[int]bool{200: false, 404: false, 408: true, 429: true, 500: true, 501: false, 503: true} {
		if got := DefaultRetryIf(&http.Response{StatusCode: code}, nil); got != want {
			t.Errorf("DefaultRetryIf(%d) = %v", code, got)
		}
	}
	refused := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{refused, true},
		{io.ErrUnexpectedEOF, true},
		{context.Canceled, false},
		{&url.Error{Op: "Get", URL: "x", Err: &net.OpError{Op: "dial", Err: &net.AddrError{Err: "invalid port", Addr: "99999"}}}, false},
	} {
		if got := DefaultRetryIf(nil, tc.err); got != tc.want {
			t.Errorf("DefaultRetryIf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Host keys name one host each, as net/http does.
func TestHostKeysCanonical(t *testing.T) {
	same := [][]string{
		{"http://example.com/", "http://example.com./", "http://example.com:/", "http://EXAMPLE.com:80/"},
		{"http://bücher.example/", "http://xn--bcher-kva.example/", "http://BÜCHER.example./"},
		{"http://[::1]/", "http://[::1]:80/"},
		{"https://api.example.com/", "https://api.example.com:443/"},
	}
	for _, group := range same {
		want := hostKey(mustURL(t, group[0]))
		for _, u := range group[1:] {
			if got := hostKey(mustURL(t, u)); got != want {
				t.Errorf("hostKey(%s) = %q, want %q as for %s", u, got, want, group[0])
			}
		}
	}
	if got := hostKey(mustURL(t, "http://bücher.example/")); got != "xn--bcher-kva.example" {
		t.Errorf("IDN key %q", got)
	}
	for opt, u := range map[string]string{
		"::1":                  "http://[::1]/",
		"[::1]:8080":           "http://[::1]:8080/",
		"Example.COM.":         "https://example.com/",
		"bücher.example:443":   "https://xn--bcher-kva.example/",
		"https://api.test:443": "https://api.test/",
	} {
		if got, want := normalizeHostOption(opt), hostKey(mustURL(t, u)); got != want {
			t.Errorf("WithHostPace(%q) names %q, but %s is %q", opt, got, u, want)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func reasons(evs []RetryEvent) []Reason {
	var r []Reason
	for _, e := range evs {
		r = append(r, e.Reason)
	}
	return r
}

func contains(rs []Reason, r Reason) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}
