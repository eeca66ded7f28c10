package retryhttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-cleanhttp"
)

// R1: the caller's request is never modified, the last response comes back
// untouched with its body unread whatever its status, and an error comes
// only when no response was had.
func TestRoundTripperContract(t *testing.T) {
	host := newStub(map[string][]step{
		"/ok":        {{status: 200, body: "hello"}},
		"/missing":   {{status: 404, body: "no such page"}},
		"/down":      {{status: 503, body: "down for maintenance"}},
		"/keyed":     {{status: 503}, {status: 201, body: "created"}},
		"/flaky-get": {{status: 502}, {status: 200, body: "second time lucky"}},
	})
	srv := serveLoopback(t, host)
	tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithAutoIdempotencyKey())
	tests := []struct {
		method, path, body string
		wantStatus         int
		wantBody           string
	}{
		{"GET", "/ok", "", 200, "hello"},
		{"GET", "/missing", "", 404, "no such page"},
		{"GET", "/down", "", 503, "down for maintenance"},
		{"POST", "/keyed", "payload", 201, "created"},
		{"GET", "/flaky-get", "", 200, "second time lucky"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			req, err := http.NewRequest(tt.method, srv.URL+tt.path+"?q=1", body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Caller", "mine")
			before := snapshot(req)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("error with a response to be had: %v", err)
			}
			if diff := cmp.Diff(before, snapshot(req)); diff != "" {
				t.Errorf("the caller's request changed (-before +after):\n%s", diff)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if got := readAll(resp); got != tt.wantBody {
				t.Errorf("body %q, want %q: the final body must come back unread", got, tt.wantBody)
			}
		})
	}
}

// requestSnapshot is what a RoundTripper must leave as it found it.
type requestSnapshot struct {
	Method, URL string
	Header      http.Header
	Ctx         context.Context
	Body        io.ReadCloser
	ContentLen  int64
}

func snapshot(r *http.Request) requestSnapshot {
	return requestSnapshot{r.Method, r.URL.String(), r.Header.Clone(), r.Context(), r.Body, r.ContentLength}
}

func (s requestSnapshot) Equal(o requestSnapshot) bool {
	return s.Method == o.Method && s.URL == o.URL && cmp.Equal(s.Header, o.Header) &&
		s.Ctx == o.Ctx && s.Body == o.Body && s.ContentLen == o.ContentLen
}

// One Transport serves many goroutines at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	var seen sync.Map
	srv := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, again := seen.LoadOrStore(r.URL.Path, true); !again {
			w.WriteHeader(503) // every first try fails
			return
		}
		io.WriteString(w, r.URL.Path)
	}))
	// Learning off: a host that refuses every first try, whatever the
	// pace, would be paced down as overloaded.
	tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithPace(1e6, 1000), WithBudget(nil), WithLearning(false))
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for i := range 25 {
				path := "/" + string(rune('a'+g)) + string(rune('a'+i%26))
				code, body := get(t, tr, srv.URL+path)
				if code != 200 || body != path {
					t.Errorf("GET %s: %d %q", path, code, body)
				}
			}
		})
	}
	wg.Wait()
}

func TestCloseIdleConnectionsReachesBase(t *testing.T) {
	base := &countingBase{base: http.DefaultTransport}
	New(WithBase(base)).CloseIdleConnections()
	if base.idle.Load() != 1 {
		t.Error("CloseIdleConnections did not reach the base")
	}
}

func TestDefaultBaseIsPooled(t *testing.T) {
	got, ok := New().base.(*http.Transport)
	if !ok {
		t.Fatalf("default base is %T, want *http.Transport", New().base)
	}
	want := cleanhttp.DefaultPooledTransport()
	if got.MaxIdleConnsPerHost != want.MaxIdleConnsPerHost || got == http.DefaultTransport {
		t.Errorf("default base is not cleanhttp's pooled transport")
	}
}

// R2: which statuses are retried.
func TestRetryStatuses(t *testing.T) {
	tests := []struct {
		status int
		opts   []Option
		want   int // requests that reach the server
	}{
		{408, nil, 3}, {429, nil, 3}, {500, nil, 3}, {502, nil, 3}, {503, nil, 3}, {504, nil, 3},
		{200, nil, 1}, {201, nil, 1}, {301, nil, 1}, {400, nil, 1}, {401, nil, 1}, {403, nil, 1},
		{404, nil, 1}, {409, nil, 1}, {422, nil, 1}, {501, nil, 1}, {505, nil, 1},
		{503, []Option{WithRetryStatuses(500)}, 1},
		{500, []Option{WithRetryStatuses(500)}, 3},
		{500, []Option{WithRetryStatuses()}, 1},
		{403, []Option{WithRetryStatuses(403, 999, -1)}, 3},
		{503, []Option{WithMaxAttempts(1)}, 1},
		{503, []Option{WithMaxAttempts(5)}, 5},
		{503, []Option{WithMaxAttempts(0)}, 3},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: tt.status}}})
			net := newPipeNet(host)
			defer net.close()
			// Learning off: a host that answers 503 to every try over a
			// second is down, and the fourth and fifth are not sent.
			tr := New(append([]Option{WithBase(net.tr), WithBudget(nil), WithLearning(false)}, tt.opts...)...)
			if code, _ := get(t, tr, "http://x.test/"); code != tt.status {
				t.Errorf("status %d came back as %d", tt.status, code)
			}
			if got := host.count(""); got != tt.want {
				t.Errorf("status %d with %d options: %d requests, want %d", tt.status, len(tt.opts), got, tt.want)
			}
		})
	}
}

// R2: which transport errors are retried, by the attempts that reach the
// base.
func TestRetryErrors(t *testing.T) {
	closed := closedPort(t)
	hangup := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close() // EOF before any answer
	}))
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(tlsSrv.Close)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name string
		url  string
		ctx  context.Context
		want int32
	}{
		{"connection refused", "http://" + closed + "/", nil, 3},
		{"EOF before the answer", hangup.URL, nil, 3},
		{"unknown certificate authority", tlsSrv.URL, nil, 1},
		{"unsupported scheme", "ftp://" + closed + "/", nil, 1},
		{"no host", "http:///path", nil, 1},
		{"cancelled context", hangup.URL, cancelled, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := &countingBase{base: cleanhttp.DefaultTransport()}
			tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			resp, err := sendCtx(ctx, tr, "GET", tt.url, "", nil)
			if err == nil {
				resp.Body.Close()
				t.Fatal("no error")
			}
			if got := base.attempts.Load(); got != tt.want {
				t.Errorf("%d attempts, want %d (error: %v)", got, tt.want, err)
			}
		})
	}
}

func TestTransientErrorTypes(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		err  error
		want bool
	}{
		{syscall.ECONNRESET, true},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{io.ErrUnexpectedEOF, true},
		{&net.DNSError{Err: "no such host", IsNotFound: true}, false},
		{&net.DNSError{Err: "server misbehaving", IsTemporary: true}, true},
		{&tls.CertificateVerificationError{Err: errors.New("bad")}, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, true}, // the base's own timeout: the caller's context lives
		{errors.New("something nobody knows"), false},
		{h2StreamError{StreamID: 1, Code: h2RefusedStream}, true},
		{h2StreamError{StreamID: 1, Code: 0x1}, false}, // PROTOCOL_ERROR
	}
	for _, tt := range tests {
		if got := transientError(ctx, tt.err); got != tt.want {
			t.Errorf("transientError(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// R4: every retry gets a fresh body from GetBody, byte for byte the
// caller's. Bodies without GetBody: body_test.go.
func TestBodies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/": {{status: 503}}})
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr), WithBudget(nil))
		payload := strings.Repeat("0123456789", 1000)
		resp, err := send(tr, "PUT", "http://x.test/", payload, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		hits := host.all()
		if len(hits) != 3 {
			t.Errorf("%d attempts, want 3", len(hits))
		}
		for i, h := range hits {
			if h.body != payload {
				t.Errorf("attempt %d sent %d bytes, not the caller's %d", i+1, len(h.body), len(payload))
			}
		}
	})
}

// R5 and seed 000: Retry-After: 0 waits the floor; 86400 is not slept
// through: the answer comes back at once and the host is parked.
func TestRetryAfterBounds(t *testing.T) {
	t.Run("zero waits the floor", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: 403, headers: map[string]string{"Retry-After": "0"}}}})
			net := newPipeNet(host)
			defer net.close()
			tr := New(WithBase(net.tr), WithRetryStatuses(403), WithMaxAttempts(5), WithBudget(nil))
			get(t, tr, "http://varnish.test/")
			if diff := cmp.Diff([]float64{0, 1, 2, 3, 4}, host.seconds()); diff != "" {
				t.Errorf("five tries (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("a day is not slept through", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: 503, headers: map[string]string{"Retry-After": "86400"}}}})
			net := newPipeNet(host)
			defer net.close()
			var ev events
			tr := New(WithBase(net.tr), onEvents(ev.add))
			start := time.Now()
			if code, _ := get(t, tr, "http://api.test/"); code != 503 {
				t.Errorf("status %d, want the 503 itself", code)
			}
			if time.Since(start) != 0 || host.count("") != 1 {
				t.Errorf("took %v and %d requests, want at once and 1", time.Since(start), host.count(""))
			}
			if evs := ev.list(); len(evs) != 1 || evs[0].Reason != ReasonServerWait {
				t.Errorf("events %+v, want one saying %q", evs, ReasonServerWait)
			}
			_, err := send(tr, "GET", "http://api.test/", "", nil)
			var pe *HostPausedError
			if !errors.As(err, &pe) || pe.Until != start.Add(MaxParking) {
				t.Errorf("next request: %v, want a parking of %v", err, MaxParking)
			}
		})
	})
	t.Run("limits are configurable", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: 503, headers: map[string]string{"Retry-After": "1"}}, {status: 503, headers: map[string]string{"Retry-After": "100"}}}})
			net := newPipeNet(host)
			defer net.close()
			tr := New(WithBase(net.tr), WithRetryAfterLimits(5*time.Second, 200*time.Second), WithBudget(nil))
			get(t, tr, "http://api.test/")
			if diff := cmp.Diff([]float64{0, 5, 105}, host.seconds()); diff != "" {
				t.Errorf("tries (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("a date counts from the answer's Date", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The board is closed 90 s; the server's clock is 40 s behind.
			start := time.Now()
			serverNow := start.Add(-40 * time.Second)
			host := newStub(nil)
			board := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				now := time.Now().Add(-40 * time.Second)
				w.Header().Set("Date", now.UTC().Format(http.TimeFormat))
				if time.Since(start) < 90*time.Second {
					w.Header().Set("Retry-After", serverNow.Add(90*time.Second).UTC().Format(http.TimeFormat))
					host.ServeHTTP(&statusWriter{ResponseWriter: w, code: 503}, r)
					return
				}
				host.ServeHTTP(w, r)
			})
			net := newPipeNet(board)
			defer net.close()
			tr := New(WithBase(net.tr), WithRetryAfterLimits(0, 120*time.Second))
			if code, _ := get(t, tr, "http://flaky.test/board"); code != 200 {
				t.Errorf("status %d, want 200 after the wait", code)
			}
			if diff := cmp.Diff([]float64{0, 90}, host.seconds()); diff != "" {
				t.Errorf("tries (-want +got):\n%s", diff)
			}
		})
	})
}

// statusWriter forces a status on a handler that would write another.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(int) { s.ResponseWriter.WriteHeader(s.code) }

// R6: full jitter, uniform(0, min(max, base*2^(n-1))).
func TestBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/": {{status: 503}}})
		net := newPipeNet(host)
		defer net.close()
		var ev events
		tr := New(WithBase(net.tr), WithMaxAttempts(8), WithBudget(nil), fixedRand(0.5), WithLearning(false),
			onEvents(ev.add), WithBackoff(time.Second, 10*time.Second))
		get(t, tr, "http://x.test/")
		var delays []time.Duration
		for _, e := range ev.list() {
			delays = append(delays, e.Delay)
		}
		s := time.Second
		want := []time.Duration{s / 2, s, 2 * s, 4 * s, 5 * s, 5 * s, 5 * s, 0}
		if diff := cmp.Diff(want, delays); diff != "" {
			t.Errorf("delays (-want +got):\n%s", diff)
		}
	})
	// The defaults: base 500 ms, max 30 s; every draw lies in its window.
	tr := New()
	for n := 1; n <= 12; n++ {
		window := min(DefaultBackoffMax, DefaultBackoffBase<<(n-1))
		for range 50 {
			c := call{t: tr}
			if d := c.backoff(n); d < 0 || d >= window {
				t.Fatalf("backoff(%d) = %v, outside [0, %v)", n, d, window)
			}
		}
	}
	for _, r := range []float64{-1, 1, 2, nanf()} {
		c := call{t: New(WithRand(func() float64 { return r }))}
		if d := c.backoff(1); d < 0 || d >= DefaultBackoffBase {
			t.Errorf("rand %v gave %v", r, d)
		}
	}
}

// R9: a wait that would end after the deadline is not started; a cancel
// during a wait returns at once with the context's error, the pending
// response closed.
func TestContextBoundsWaits(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: 503, headers: map[string]string{"Retry-After": "5"}}}})
			net := newPipeNet(host)
			defer net.close()
			var ev events
			tr := New(WithBase(net.tr), onEvents(ev.add))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := sendCtx(ctx, tr, "GET", "http://x.test/", "", nil)
			if err != nil || resp.StatusCode != 503 {
				t.Fatalf("got %v, %v; want the 503 itself", resp, err)
			}
			resp.Body.Close()
			if time.Since(start) != 0 {
				t.Errorf("returned after %v, want at once", time.Since(start))
			}
			if evs := ev.list(); len(evs) != 1 || evs[0].Reason != ReasonDeadline {
				t.Errorf("events %+v, want one saying %q", evs, ReasonDeadline)
			}
		})
	})
	t.Run("cancel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: 503, headers: map[string]string{"Retry-After": "30"}, body: "busy"}}})
			net := newPipeNet(host)
			defer net.close()
			base := &countingBase{base: net.tr}
			tr := New(WithBase(base))
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(5*time.Second, cancel)
			start := time.Now()
			_, err := sendCtx(ctx, tr, "GET", "http://x.test/", "", nil)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("error %v, want one that errors.Is context.Canceled", err)
			}
			if got := time.Since(start); got != 5*time.Second {
				t.Errorf("returned after %v, want at the cancel (5s)", got)
			}
			if base.closes.Load() != 1 {
				t.Error("the pending response was not closed")
			}
		})
	})
}

// R10: a retried response is drained so its connection is reused; one
// larger than 64 KiB is closed without reading it all.
func TestConnectionsReused(t *testing.T) {
	tests := []struct {
		name      string
		bodySize  int
		wantConns int32
	}{
		{"small body drained", 10 << 10, 1},
		{"large body dropped", 1 << 20, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := strings.Repeat("x", tt.bodySize)
			host := newStub(map[string][]step{"/": {{status: 503, body: body}, {status: 503, body: body}, {status: 200}}})
			srv := httptest.NewUnstartedServer(host)
			var conns atomic.Int32
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()
			tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
			defer tr.CloseIdleConnections()
			if code, _ := get(t, tr, srv.URL); code != 200 {
				t.Fatalf("status %d", code)
			}
			if got := conns.Load(); got != tt.wantConns {
				t.Errorf("%d connections for 3 tries, want %d", got, tt.wantConns)
			}
		})
	}
}

// R11: Transports nested in each other retry in one place only: three
// layers of four tries reach the server 4 times, not 64.
func TestNestedTransportsRetryOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/": {{status: 503}}})
		net := newPipeNet(host)
		defer net.close()
		// Learning off: a host that answers 503 to every try for a second
		// is down, and the fourth try is not sent.
		opts := []Option{WithMaxAttempts(4), WithBudget(nil), WithLearning(false)}
		inner := New(append(opts, WithBase(net.tr))...)
		middle := New(append(opts, WithBase(inner))...)
		outer := New(append(opts, WithBase(middle))...)
		get(t, outer, "http://x.test/")
		if got := host.count(""); got != 4 {
			t.Errorf("%d requests reached the server, want 4", got)
		}
		// The same with an unknown RoundTripper between two of the layers.
		before := host.count("")
		wrapped := New(append(opts, WithBase(&countingBase{base: inner}))...)
		outer2 := New(append(opts, WithBase(New(append(opts, WithBase(wrapped))...)))...)
		get(t, outer2, "http://x.test/")
		if got := host.count("") - before; got != 4 {
			t.Errorf("through a wrapper: %d requests reached the server, want 4", got)
		}
		// The inner layers still park: a Retry-After seen below is obeyed above.
		host.scripts["/ra"] = []step{{status: 503, headers: map[string]string{"Retry-After": "7"}}, {status: 200}}
		start := time.Now()
		get(t, outer, "http://y.test/ra") // a host that has not refused yet
		if got := time.Since(start); got != 7*time.Second {
			t.Errorf("retry after %v, want 7s", got)
		}
	})
}

// R12: one OnRetry event and one log line per retry, without headers or
// query; a RetryError that says what happened and unwraps.
func TestReporting(t *testing.T) {
	var logs bytes.Buffer
	var ev events
	closed := closedPort(t)
	tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil), onEvents(ev.add),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	_, err := send(tr, "GET", "http://"+closed+"/v1/x?token=s3cret", "", map[string]string{"Authorization": "Bearer s3cret"})
	var re *RetryError
	if !errors.As(err, &re) {
		t.Fatalf("error %T %v, want *RetryError", err, err)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%v does not unwrap to ECONNREFUSED", err)
	}
	want := regexp.MustCompile(`^retryhttp: gave up after 3 attempts over \S+: .*connection refused$`)
	if !want.MatchString(err.Error()) {
		t.Errorf("error text %q does not match %v", err, want)
	}
	evs := ev.list()
	if len(evs) != 3 || evs[0].Attempt != 1 || evs[1].Attempt != 2 || evs[2].Reason != ReasonAttempts {
		t.Errorf("events %+v: want retries after tries 1 and 2, then %q", evs, ReasonAttempts)
	}
	// Two retries, the host down after the third refused connection, the
	// refusal.
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d log lines, want 4:\n%s", len(lines), logs.String())
	}
	for _, field := range []string{"host down", "host=" + closed, "since=", "connection refused"} {
		if !strings.Contains(lines[2], field) {
			t.Errorf("log line %q lacks %q", lines[2], field)
		}
	}
	for _, field := range []string{"method=GET", "host=" + closed, "path=/v1/x", `attempt="2 of 3"`, "wait=0", "connection refused"} {
		if !strings.Contains(lines[0], field) {
			t.Errorf("log line %q lacks %q", lines[0], field)
		}
	}
	if strings.Contains(logs.String()+err.Error(), "s3cret") {
		t.Error("a header or the query reached the log or the error")
	}
}

// Logging is silent unless a logger is given: nothing goes to slog's
// default logger.
func TestSilentByDefault(t *testing.T) {
	var logs bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(old)
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/": {{status: 503}}})
		net := newPipeNet(host)
		defer net.close()
		get(t, New(WithBase(net.tr)), "http://x.test/")
	})
	if logs.Len() != 0 {
		t.Errorf("logged without a logger: %s", logs.String())
	}
}
