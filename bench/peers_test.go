package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/rehttp"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/retryhttp/retryhttp"
)

// This file holds the harness: how each library is configured, the two
// bases every library runs over, the cases, and the one operation that
// every benchmark and test repeats. TestPeers runs every case once with
// every library over both bases, so `go test ./...` proves the harness
// measures successes and not failures, without running a benchmark.

// A doer sends one request the way a user of the library would. body is the
// payload the request carries (nil for none); only a library whose native
// API wants the bytes themselves (retryablehttp-native) looks at it, every
// other takes req as it is, with the Body and GetBody of http.NewRequest.
type doer func(req *http.Request, body []byte) (*http.Response, error)

// A lib is one library, configured the same way for every case: three tries
// in all (two retries), the statuses 408, 429, 500, 502, 503, 504 retried,
// zero wait between tries, no logging, every retried response drained and
// closed. make wraps base, which it must use for every attempt.
type lib struct {
	name string
	make func(base http.RoundTripper) doer
}

var libs = []lib{
	{"bare", newBare},
	{"retryhttp", newRetryhttp},
	{"retryablehttp", newRetryablehttp},
	{"retryablehttp-native", newRetryablehttpNative},
	{"failsafehttp", newFailsafehttp},
	{"rehttp", newRehttp},
}

// retryStatuses are those retryhttp retries by default; each peer that can
// be told which statuses to retry is told these.
var retryStatuses = []int{408, 429, 500, 502, 503, 504}

// newBare is the physical limit: an http.Client straight on the base. To
// stay comparable in the retry case, it retries a 503 once by hand the way
// a minimal loop would: drain and close the 503, rewind the body, send
// again.
func newBare(base http.RoundTripper) doer {
	c := &http.Client{Transport: base}
	return func(req *http.Request, _ []byte) (*http.Response, error) {
		resp, err := c.Do(req)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			return resp, err
		}
		drainClose(resp)
		if req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			r := *req
			r.Body = body
			req = &r
		}
		return c.Do(req)
	}
}

// newRetryhttp is retryhttp with its defaults but a zero wait: a backoff of
// 1 ns scaled by a jitter of 0, and a budget that never runs out (one retry
// per first try, plus 1000 a second) so the retry case measures retries.
// The budget is still counted on every request, as it is by default.
func newRetryhttp(base http.RoundTripper) doer {
	c := &http.Client{Transport: retryhttp.New(
		retryhttp.WithBase(base),
		retryhttp.WithMaxAttempts(3),
		retryhttp.WithBackoff(time.Nanosecond, time.Nanosecond),
		retryhttp.WithRand(func() float64 { return 0 }),
		retryhttp.WithBudget(retryhttp.NewBudget(1, 1000)),
		// Every first try of Retry503 is a 503: learning would take the
		// host for overloaded and pace it, and the case is the retry's
		// cost, as for the peers, which learn nothing.
		retryhttp.WithLearning(false),
	)}
	return func(req *http.Request, _ []byte) (*http.Response, error) { return c.Do(req) }
}

// newRetryablehttpClient is go-retryablehttp with its logger off (a nil
// Logger, as its README says; the default logs every request), two
// retries and no wait (RetryWaitMin and RetryWaitMax of 0 make DefaultBackoff
// return 0). Its DefaultRetryPolicy retries 429 and every 5xx but 501.
func newRetryablehttpClient(base http.RoundTripper) *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: base}
	rc.Logger = nil
	rc.RetryMax = 2
	rc.RetryWaitMin = 0
	rc.RetryWaitMax = 0
	return rc
}

// newRetryablehttp is go-retryablehttp as a drop-in *http.Client
// (Client.StandardClient, whose RoundTripper converts each *http.Request
// with FromRequest): the same input every other library gets.
func newRetryablehttp(base http.RoundTripper) doer {
	c := newRetryablehttpClient(base).StandardClient()
	return func(req *http.Request, _ []byte) (*http.Response, error) { return c.Do(req) }
}

// newRetryablehttpNative is go-retryablehttp through its own API: a
// retryablehttp.Request around the *http.Request, with the payload handed
// over as a []byte (SetBody), which is how its README makes requests. It
// skips the outer http.Client of the drop-in.
func newRetryablehttpNative(base http.RoundTripper) doer {
	rc := newRetryablehttpClient(base)
	return func(req *http.Request, body []byte) (*http.Response, error) {
		rr := &retryablehttp.Request{Request: req}
		if body != nil {
			if err := rr.SetBody(body); err != nil {
				return nil, err
			}
		}
		return rc.Do(rr)
	}
}

// newFailsafehttp is failsafehttp's retry policy (429 and every 5xx but
// 501, transport errors), three attempts, no delay (its default), returning
// the last response rather than an ExceededError when tries run out. It does
// not close a response it retries, which would leak the connection, so a
// listener drains and closes it.
func newFailsafehttp(base http.RoundTripper) doer {
	policy := failsafehttp.NewRetryPolicyBuilder().
		WithMaxAttempts(3).
		ReturnLastFailure().
		OnRetryScheduled(func(e failsafe.ExecutionScheduledEvent[*http.Response]) {
			if resp := e.LastResult(); resp != nil {
				drainClose(resp)
			}
		}).
		Build()
	c := &http.Client{Transport: failsafehttp.NewRoundTripper(base, policy)}
	return func(req *http.Request, _ []byte) (*http.Response, error) { return c.Do(req) }
}

// newRehttp is rehttp with two retries of the retried statuses and of
// temporary errors, only for idempotent methods, and no delay. It drains
// and closes a retried response itself.
func newRehttp(base http.RoundTripper) doer {
	rt := rehttp.NewTransport(base,
		rehttp.RetryAll(
			rehttp.RetryMaxRetries(2),
			rehttp.RetryAny(rehttp.RetryStatuses(retryStatuses...), rehttp.RetryTemporaryErr()),
			rehttp.RetryHTTPMethods("GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"),
		),
		rehttp.ConstDelay(0))
	c := &http.Client{Transport: rt}
	return func(req *http.Request, _ []byte) (*http.Response, error) { return c.Do(req) }
}

// drainClose reads what is left of a body and closes it.
func drainClose(resp *http.Response) {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// A benchCase is one kind of request.
type benchCase struct {
	name    string
	method  string
	payload []byte // the request body; nil for none
	fail503 bool   // the server answers every first try 503, every second 200
	bases   []string
}

var (
	kib = bytes.Repeat([]byte("0123456789abcdef"), 1<<10/16)
	mib = bytes.Repeat([]byte("0123456789abcdef"), 1<<20/16)

	caseGET    = benchCase{name: "GET", method: http.MethodGet, bases: []string{"mem", "memtr", "loop"}}
	casePOST   = benchCase{name: "POST1KiB", method: http.MethodPost, payload: kib, bases: []string{"mem", "loop"}}
	caseRetry  = benchCase{name: "Retry503", method: http.MethodGet, fail503: true, bases: []string{"mem", "loop"}}
	caseUpload = benchCase{name: "Upload1MiB", method: http.MethodPut, payload: mib, bases: []string{"mem", "loop"}}
)

// attempts is how many requests reach the base for one operation.
func (c benchCase) attempts() int64 {
	if c.fail503 {
		return 2
	}
	return 1
}

// newRequest makes a request for one operation from a template, exactly as
// http.NewRequest makes one with a *bytes.Reader body: ContentLength set, a
// Body that wraps the reader in io.NopCloser, and a GetBody that returns a
// fresh reader over the same bytes. Copying the template instead of calling
// http.NewRequest keeps URL parsing out of the measurement; what is left is
// the same for every library.
func newRequest(tmpl *http.Request, payload []byte) *http.Request {
	if payload == nil {
		return tmpl // a request without a body can be sent again and again
	}
	r := new(http.Request)
	*r = *tmpl
	body := bytes.NewReader(payload)
	r.ContentLength = int64(body.Len())
	r.Body = io.NopCloser(body)
	snapshot := *body
	r.GetBody = func() (io.ReadCloser, error) {
		s := snapshot
		return io.NopCloser(&s), nil
	}
	return r
}

// do is the operation every benchmark and test repeats: send one request,
// check that it ended in a 200 with the expected body, drain and close it.
func do(d doer, tmpl *http.Request, c benchCase) error {
	resp, err := d(newRequest(tmpl, c.payload), c.payload)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		drainClose(resp)
		return fmt.Errorf("%s: status %d, want 200", c.name, resp.StatusCode)
	}
	var b [8]byte
	n, err := io.ReadFull(resp.Body, b[:])
	if err != io.ErrUnexpectedEOF || string(b[:n]) != "ok" {
		drainClose(resp)
		return fmt.Errorf("%s: body %q (%v), want \"ok\"", c.name, b[:n], err)
	}
	return resp.Body.Close()
}

// A fixture is one base for one library, with the counters that prove what
// reached it.
type fixture struct {
	base   http.RoundTripper
	url    string
	reqs   *atomic.Int64 // requests that reached the server or in-memory base
	bytes  *atomic.Int64 // request body bytes they carried
	errs   *atomic.Int64 // request bodies that differed from the payload (when checked)
	close  func()
	server *httptest.Server
}

// newFixture makes a base of the given kind for case c. With check set,
// every request body is compared with c.payload (tests); without, it is
// only counted (benchmarks, so the base costs the same for every library).
//
// The bases are:
//   - "mem", an in-memory RoundTripper that isolates the decorators' own
//     CPU cost;
//   - "memtr", the same behind an *http.Transport (RegisterProtocol sends
//     the scheme "mem" straight to it), because retryhttp skips its nesting
//     mark (a context value and a request clone) when its base is a plain
//     *http.Transport, as its default base is: this is the cost of the
//     default configuration, where "mem" is that of a custom base;
//   - "loop", a pooled *http.Transport to an httptest.Server on loopback.
func newFixture(kind string, c benchCase, check bool) *fixture {
	f := &fixture{reqs: new(atomic.Int64), bytes: new(atomic.Int64), errs: new(atomic.Int64)}
	// A counter on every request is a shared cache line in the parallel
	// benchmarks; only the cases that need it keep one.
	count := c.fail503 || c.payload != nil || check
	status := func() int {
		if !count {
			return http.StatusOK
		}
		n := f.reqs.Add(1)
		if c.fail503 && n%2 == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	readBody := func(body io.Reader) error {
		if !check {
			n, err := io.Copy(io.Discard, body)
			f.bytes.Add(n)
			return err
		}
		got, err := io.ReadAll(body)
		f.bytes.Add(int64(len(got)))
		if !bytes.Equal(got, c.payload) {
			f.errs.Add(1)
		}
		return err
	}
	switch kind {
	case "mem":
		f.base = &memBase{status: status, readBody: readBody}
		f.url = "http://mem.test/x"
		f.close = func() {}
	case "memtr":
		tr := &http.Transport{}
		tr.RegisterProtocol("mem", &memBase{status: status, readBody: readBody})
		f.base = tr
		f.url = "mem://mem.test/x"
		f.close = func() {}
	case "loop":
		f.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body != nil {
				if err := readBody(r.Body); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
			}
			st := status()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Content-Length", "2")
			w.WriteHeader(st)
			io.WriteString(w, "ok")
		}))
		tr := cleanhttp.DefaultPooledTransport()
		f.base = tr
		f.url = f.server.URL + "/x"
		f.close = func() {
			tr.CloseIdleConnections()
			f.server.Close()
		}
	default:
		panic("unknown base " + kind)
	}
	return f
}

func (f *fixture) template(c benchCase) *http.Request {
	req, err := http.NewRequest(c.method, f.url, nil)
	if err != nil {
		panic(err)
	}
	return req
}

// memBase is the in-memory base: it reads and closes the request body as a
// transport would, and answers with a canned response whose body costs one
// small allocation to make and nothing to read or close. The header map is
// shared and read-only.
type memBase struct {
	status   func() int
	readBody func(io.Reader) error
}

var memHeader = http.Header{
	"Content-Type":   {"text/plain; charset=utf-8"},
	"Content-Length": {"2"},
	"Date":           {"Mon, 02 Jan 2006 15:04:05 GMT"},
}

func (m *memBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		err := m.readBody(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	st := m.status()
	return &http.Response{
		Status:        http.StatusText(st),
		StatusCode:    st,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        memHeader,
		Body:          &cannedBody{s: "ok"},
		ContentLength: 2,
		Request:       req,
	}, nil
}

type cannedBody struct {
	s   string
	off int
}

func (b *cannedBody) Read(p []byte) (int, error) {
	if b.off >= len(b.s) {
		return 0, io.EOF
	}
	n := copy(p, b.s[b.off:])
	b.off += n
	return n, nil
}

func (b *cannedBody) Close() error { return nil }

// verify checks, after ops operations, that each reached the base the
// expected number of times with the whole payload each time.
func (f *fixture) verify(c benchCase, ops int64) error {
	if c.fail503 || c.payload != nil {
		if got, want := f.reqs.Load(), ops*c.attempts(); got != want {
			return fmt.Errorf("%s: %d requests reached the base for %d operations, want %d", c.name, got, ops, want)
		}
	}
	if got, want := f.bytes.Load(), ops*c.attempts()*int64(len(c.payload)); got != want {
		return fmt.Errorf("%s: the base got %d body bytes for %d operations, want %d", c.name, got, ops, want)
	}
	if n := f.errs.Load(); n != 0 {
		return fmt.Errorf("%s: %d request bodies differed from the payload", c.name, n)
	}
	return nil
}

var allCases = []benchCase{caseGET, casePOST, caseRetry, caseUpload}

// TestPeers runs every case with every library over both bases, a few
// times sequentially and, for GET, from several goroutines at once, and
// checks the outcome: a 200 with its body, the right number of requests at
// the base, the whole payload on every attempt.
func TestPeers(t *testing.T) {
	for _, c := range allCases {
		for _, kind := range c.bases {
			for _, l := range libs {
				t.Run(c.name+"/base="+kind+"/lib="+l.name, func(t *testing.T) {
					f := newFixture(kind, c, true)
					defer f.close()
					d := l.make(f.base)
					tmpl := f.template(c)
					const ops = 3
					for range ops {
						if err := do(d, tmpl, c); err != nil {
							t.Fatal(err)
						}
					}
					if err := f.verify(c, ops); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
	for _, kind := range caseGET.bases {
		for _, l := range libs {
			t.Run("GETParallel/base="+kind+"/lib="+l.name, func(t *testing.T) {
				f := newFixture(kind, caseGET, true)
				defer f.close()
				d := l.make(f.base)
				const goroutines, ops = 4, 5
				var wg sync.WaitGroup
				errs := make(chan error, goroutines)
				for range goroutines {
					wg.Go(func() {
						tmpl := f.template(caseGET) // one per goroutine, as in the benchmark
						for range ops {
							if err := do(d, tmpl, caseGET); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				if got, want := f.reqs.Load(), int64(goroutines*ops); got != want {
					t.Errorf("%d requests reached the base, want %d", got, want)
				}
			})
		}
	}
}

// TestFailsafeLeaksWithoutClose documents why newFailsafehttp has a
// listener: without one, a retried response is never closed, and on
// loopback its connection is lost to the pool (a new one is dialled for the
// retry).
func TestFailsafeLeaksWithoutClose(t *testing.T) {
	var dials atomic.Int64
	f := newFixture("loop", caseRetry, true)
	defer f.close()
	tr := f.base.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	policy := failsafehttp.NewRetryPolicyBuilder().WithMaxAttempts(3).ReturnLastFailure().Build()
	c := &http.Client{Transport: failsafehttp.NewRoundTripper(tr, policy)}
	d := func(req *http.Request, _ []byte) (*http.Response, error) { return c.Do(req) }
	tmpl := f.template(caseRetry)
	const ops = 3
	for range ops {
		if err := do(d, tmpl, caseRetry); err != nil {
			t.Fatal(err)
		}
	}
	if got := dials.Load(); got < ops+1 {
		t.Errorf("failsafehttp without a closing listener dialled %d times for %d retried requests; expected a new connection per retry", got, ops)
	}
	// With the listener, one connection serves everything.
	dials.Store(0)
	tr.CloseIdleConnections()
	d = newFailsafehttp(tr)
	for range ops {
		if err := do(d, tmpl, caseRetry); err != nil {
			t.Fatal(err)
		}
	}
	if got := dials.Load(); got != 1 {
		t.Errorf("failsafehttp with the closing listener dialled %d times, want 1", got)
	}
}
