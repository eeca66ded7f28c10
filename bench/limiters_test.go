package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/PuerkitoBio/rehttp"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/go-chi/httprate"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/retryhttp/retryhttp"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
)

// This file is the proof harness for per-host adaptive pacing: 30 workers
// fetch 150 pages from a server guarded by a real rate-limiting middleware
// of the Go ecosystem (10 requests a second), through each library with
// its default options. TestLimiters runs every middleware x library pair
// inside a testing/synctest bubble, over an in-memory network, so the
// middlewares' clocks and every library's sleeps are virtual: a 20-second
// run takes a fraction of a second of real time. limiters_net_test.go runs
// the same over real loopback on the real clock, on request only.
//
//	go test -run TestLimiters -v .                  # the table, and retryhttp's targets asserted
//	LIMITERS_TABLE=1 go test -run TestLimiters -v . # the table only, nothing asserted
//	LIMITERS_LOOPBACK=1 go test -run TestLimitersLoopback -v -parallel 8 .

// The workload.
const (
	limPages       = 150                              // pages to fetch, one GET each, from a shared queue
	limWorkers     = 30                               // workers taking pages from the queue
	limRate        = 10                               // requests a second the middleware lets through
	limService     = 5 * time.Millisecond             // the guarded handler's service time
	limLatency     = time.Millisecond                 // simulated network latency, per request
	limDeadline    = 120 * time.Second                // bound on one run (virtual inside a bubble)
	limMaxRequests = 20000                            // bound on the requests of one run: past it the run is cut
	limIdeal       = limPages * time.Second / limRate // 15 s: every page at the allowed rate, none refused
)

// limClockOffset is slept at the start of each bubble, before the server
// and its limiter exist. A bubble's clock starts at midnight UTC, on a
// whole second; a real run starts anywhere within one. Without the offset,
// httprate's windows, its X-RateLimit-Reset (whole Unix seconds, truncated)
// and the Date header would all fall on the same second boundaries, which
// they never do on a real clock. LIMITERS_OFFSET (a duration) overrides it.
var limClockOffset = 437 * time.Millisecond

func init() {
	if v := os.Getenv("LIMITERS_OFFSET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			panic("LIMITERS_OFFSET: " + err.Error())
		}
		limClockOffset = d
	}
}

// The targets retryhttp must reach against every middleware, once it
// learns a host's capacity (see assertTargets).
const (
	targetMinFetched   = 148 // pages of 150
	targetMaxPerPage   = 1.2 // requests the server received per page fetched
	targetMaxTimeRatio = 1.2 // time to fetch everything over limIdeal
)

// A limMiddleware guards a handler the way a service would use it. make is
// called inside the run's bubble, so the limiter's clock is the bubble's.
type limMiddleware struct {
	name string
	make func(next http.Handler) http.Handler
}

var limMiddlewares = []limMiddleware{
	{"httprate", newHTTPRate},
	{"throttled", newThrottled},
}

// newHTTPRate is go-chi/httprate v0.16.1, 10 requests a second for
// everyone: LimitBy with the constant key, which is exactly what its
// (deprecated) LimitAll does; with a single client it is also what
// LimitByIP does. A sliding-window counter: it sends X-RateLimit-Limit,
// -Remaining and -Reset (the end of the current window as a Unix time) on
// every answer, and Retry-After (the window length, 1 s) on a 429.
func newHTTPRate(next http.Handler) http.Handler {
	return httprate.LimitBy(limRate, time.Second, httprate.Key("*"))(next)
}

// newThrottled is throttled/throttled v2.15.0: HTTPRateLimiterCtx over a
// GCRA limiter in its memstore, PerSec(10) with MaxBurst 9 (so a burst of
// 10 and X-RateLimit-Limit: 10), VaryBy nil (one key for everyone). It
// sends X-RateLimit-Limit, -Remaining and -Reset (seconds until the bucket
// is full again, rounded up) on every answer, and Retry-After (seconds
// until one more request is allowed, rounded up) on a 429.
func newThrottled(next http.Handler) http.Handler {
	store, err := memstore.NewCtx(65536)
	if err != nil {
		panic(err)
	}
	limiter, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{MaxRate: throttled.PerSec(limRate), MaxBurst: limRate - 1})
	if err != nil {
		panic(err)
	}
	h := &throttled.HTTPRateLimiterCtx{RateLimiter: limiter}
	return h.RateLimit(next)
}

// A limClient is one library with its default options. make wraps base,
// which it must use for every attempt (it dials the run's server).
type limClient struct {
	name string
	make func(base http.RoundTripper) *http.Client
}

var limClients = []limClient{
	{"retryhttp", newLimRetryhttp},
	{"retryablehttp", newLimRetryablehttp},
	{"failsafehttp", newLimFailsafehttp},
	{"rehttp", newLimRehttp},
}

// newLimRetryhttp is retryhttp.NewClient() with its defaults; only the base
// is given, to reach the run's server.
func newLimRetryhttp(base http.RoundTripper) *http.Client {
	return retryhttp.NewClient(retryhttp.WithBase(base))
}

// newLimRetryablehttp is go-retryablehttp's NewClient() (4 retries, waits
// of 1 s doubling to 30 s, or the Retry-After of a 429 or 503) with its
// logger off, as a drop-in *http.Client. Only the transport of its
// HTTPClient is replaced. When it gives up it closes the last response and
// returns an error.
func newLimRetryablehttp(base http.RoundTripper) *http.Client {
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.HTTPClient.Transport = base
	return rc.StandardClient()
}

// newLimFailsafehttp is the retry policy failsafehttp recommends for HTTP,
// NewRetryPolicyBuilder() with its defaults (2 retries, 429 and 5xx but
// 501, a wait of Retry-After's delay-seconds on a 429 or 503, else none),
// behind its round tripper. failsafehttp closes neither a response it
// retries nor the last one, which it drops for an ExceededError when the
// retries run out; two listeners drain and close them, which changes no
// request (inside a bubble a leaked body would also leave the transport's
// goroutine blocked for ever).
func newLimFailsafehttp(base http.RoundTripper) *http.Client {
	policy := failsafehttp.NewRetryPolicyBuilder().
		OnRetryScheduled(func(e failsafe.ExecutionScheduledEvent[*http.Response]) {
			if resp := e.LastResult(); resp != nil {
				drainClose(resp)
			}
		}).
		OnRetriesExceeded(func(e failsafe.ExecutionEvent[*http.Response]) {
			if resp := e.LastResult(); resp != nil {
				drainClose(resp)
			}
		}).
		Build()
	return &http.Client{Transport: failsafehttp.NewRoundTripper(base, policy)}
}

// newLimRehttp is rehttp in a typical configuration: 3 retries of 429, 5xx
// (but 501) and temporary errors, exponential backoff with jitter from 1 s
// to 30 s. It ignores Retry-After and hands the last response back.
func newLimRehttp(base http.RoundTripper) *http.Client {
	rt := rehttp.NewTransport(base,
		rehttp.RetryAll(
			rehttp.RetryMaxRetries(3),
			rehttp.RetryAny(rehttp.RetryStatuses(429, 500, 502, 503, 504), rehttp.RetryTemporaryErr()),
		),
		rehttp.ExpJitterDelay(time.Second, 30*time.Second))
	return &http.Client{Transport: rt}
}

// limResult is what one run counted.
type limResult struct {
	middleware, client string
	fetched            int           // pages whose final answer was a 200
	statusBack         int           // pages whose final answer was another status (a 429 handed back)
	errs               int           // pages whose request ended in an error
	firstErr           string        // the first such error
	requests           int64         // requests the server received, refused ones included
	refused            int64         // of which the middleware answered 429
	elapsed            time.Duration // first request to the last worker done
	cut                string        // why the run was cut short, if it was
	seen               *limHeaders   // what the middleware said
}

// perPage is the requests the server received per page fetched (all of
// them, if nothing was fetched).
func (r limResult) perPage() float64 {
	return float64(r.requests) / float64(max(r.fetched, 1))
}

// ratio is the run's time over the ideal time.
func (r limResult) ratio() float64 { return r.elapsed.Seconds() / limIdeal.Seconds() }

// limHeaders keeps the rate-limit headers of the first 200 and the first
// 429 a run saw, and every distinct Retry-After value sent with a 429.
type limHeaders struct {
	mu          sync.Mutex
	ok, refused http.Header
	retryAfter  []string
}

var limHeaderNames = []string{
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Increment",
	"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After",
}

func (s *limHeaders) record(status int, h http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := func() http.Header {
		out := http.Header{}
		for _, k := range limHeaderNames {
			if v := h.Values(k); len(v) > 0 {
				out[k] = slices.Clone(v)
			}
		}
		return out
	}
	switch status {
	case http.StatusOK:
		if s.ok == nil {
			s.ok = keep()
		}
	case http.StatusTooManyRequests:
		if s.refused == nil {
			s.refused = keep()
		}
		if v := h.Get("Retry-After"); !slices.Contains(s.retryAfter, v) {
			s.retryAfter = append(s.retryAfter, v)
		}
	}
}

// describe prints the headers kept, one answer per line.
func (s *limHeaders) describe() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := func(h http.Header) string {
		if h == nil {
			return "(none seen)"
		}
		var parts []string
		for _, k := range limHeaderNames {
			if v, ok := h[k]; ok {
				parts = append(parts, k+": "+strings.Join(v, ", "))
			}
		}
		if len(parts) == 0 {
			return "(no rate-limit header)"
		}
		return strings.Join(parts, "; ")
	}
	return fmt.Sprintf("first 200 recorded: %s\n  first 429 recorded: %s\n  Retry-After values on 429s: %q",
		line(s.ok), line(s.refused), s.retryAfter)
}

// limServer is the server side of a run: the counter outside the
// middleware, a simulated network latency, the middleware, and behind it
// the guarded handler.
type limServer struct {
	requests atomic.Int64
	refused  atomic.Int64
	seen     limHeaders
	cut      atomic.Value // string: why the run was cut short
	cancel   context.CancelFunc
	handler  http.Handler
}

func newLimServer(mw limMiddleware, cancel context.CancelFunc) *limServer {
	s := &limServer{cancel: cancel}
	guarded := mw.make(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(limService)
		body := "page " + strings.TrimPrefix(r.URL.Path, "/page/")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := s.requests.Add(1); n > limMaxRequests {
			s.cut.CompareAndSwap(nil, fmt.Sprintf("more than %d requests", limMaxRequests))
			s.cancel()
			http.Error(w, "request bound reached", http.StatusServiceUnavailable)
			return
		}
		time.Sleep(limLatency)
		rec := &statusRecorder{ResponseWriter: w}
		guarded.ServeHTTP(rec, r)
		if rec.status == http.StatusTooManyRequests {
			s.refused.Add(1)
		}
		s.seen.record(rec.status, w.Header())
	})
	return s
}

// statusRecorder notes the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

// fetchAll is the client side of a run: limWorkers workers take page
// numbers from one queue and send one GET each through client; a page is
// fetched when the final answer is a 200 with its body. Nothing is retried
// here: a status other than 200, or an error, leaves the page unfetched.
func fetchAll(ctx context.Context, client *http.Client, url string, srv *limServer) limResult {
	var (
		next                       atomic.Int64
		fetched, statusBack, nerrs atomic.Int64
		firstErr                   atomic.Value
		wg                         sync.WaitGroup
	)
	start := time.Now()
	for range limWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				page := next.Add(1)
				if page > limPages {
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/page/%d", url, page), nil)
				if err != nil {
					panic(err)
				}
				resp, err := client.Do(req)
				if err != nil {
					nerrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					nerrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case resp.StatusCode != http.StatusOK:
					statusBack.Add(1)
				case string(body) == "page "+strconv.FormatInt(page, 10):
					fetched.Add(1)
				default:
					nerrs.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("page %d: unexpected body %q", page, body))
				}
			}
		})
	}
	wg.Wait()
	r := limResult{
		fetched:    int(fetched.Load()),
		statusBack: int(statusBack.Load()),
		errs:       int(nerrs.Load()),
		requests:   srv.requests.Load(),
		refused:    srv.refused.Load(),
		elapsed:    time.Since(start),
	}
	if s, ok := firstErr.Load().(string); ok {
		r.firstErr = s
	}
	if s, ok := srv.cut.Load().(string); ok {
		r.cut = s
	} else if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.cut = fmt.Sprintf("deadline of %v", limDeadline)
	}
	return r
}

// runVirtual runs one middleware x library pair inside a synctest bubble:
// an httptest server on an in-memory pipe listener, a pooled transport
// whose DialContext dials that listener, the library around it. Every
// clock involved is the bubble's, so the run is exact and fast.
func runVirtual(t *testing.T, mw limMiddleware, lc limClient) limResult {
	var res limResult
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(limClockOffset)
		ctx, cancel := context.WithTimeout(context.Background(), limDeadline)
		defer cancel()
		srv := newLimServer(mw, cancel)
		ts := httptest.NewUnstartedServer(srv.handler)
		ts.Listener.Close() // the loopback listener it made; this run stays in memory
		pl := newPipeListener("limited.test")
		ts.Listener = pl
		ts.Start()
		tr := cleanhttp.DefaultPooledTransport()
		tr.DialContext = pl.dial
		res = fetchAll(ctx, lc.make(tr), ts.URL, srv)
		tr.CloseIdleConnections()
		ts.Close()
		res.middleware, res.client = mw.name, lc.name
		res.seen = &srv.seen
	})
	return res
}

// pipeListener is an in-memory network for a synctest bubble: each dial
// makes a net.Pipe and hands one end to Accept. net.Pipe blocks durably, so
// virtual time advances while both sides wait.
type pipeListener struct {
	addr  string
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener(addr string) *pipeListener {
	return &pipeListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		c.Close()
		s.Close()
		return nil, errors.New("pipe listener closed")
	case <-ctx.Done():
		c.Close()
		s.Close()
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.addr) }

type pipeAddr string

func (pipeAddr) Network() string  { return "pipe" }
func (a pipeAddr) String() string { return string(a) }

// runMatrix runs every middleware x library pair with run, in parallel
// subtests, and returns the results in the order of limMiddlewares and
// limClients.
func runMatrix(t *testing.T, run func(*testing.T, limMiddleware, limClient) limResult) []limResult {
	results := make([]limResult, len(limMiddlewares)*len(limClients))
	t.Run("runs", func(t *testing.T) {
		for i, mw := range limMiddlewares {
			for j, lc := range limClients {
				t.Run(mw.name+"/"+lc.name, func(t *testing.T) {
					t.Parallel()
					results[i*len(limClients)+j] = run(t, mw, lc)
				})
			}
		}
	})
	return results
}

// limTable is the markdown table of a matrix's results.
func limTable(results []limResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d workers, %d pages, %d req/s allowed, ideal time %v\n\n", limWorkers, limPages, limRate, limIdeal)
	b.WriteString("| middleware | library | fetched | requests | req/page | refused (429) | 429 back | errors | time | ideal | ratio |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		elapsed := fmt.Sprintf("%.1f s", r.elapsed.Seconds())
		if r.cut != "" {
			elapsed += " (cut: " + r.cut + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f | %d | %d | %d | %s | %.0f s | %.2f |\n",
			r.middleware, r.client, r.fetched, r.requests, r.perPage(), r.refused, r.statusBack, r.errs,
			elapsed, limIdeal.Seconds(), r.ratio())
	}
	for _, r := range results {
		if r.firstErr != "" {
			fmt.Fprintf(&b, "\n%s/%s first error: %s", r.middleware, r.client, shorten(r.firstErr, 160))
		}
	}
	return b.String()
}

// shorten cuts s to at most n bytes, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// logMatrix logs the table and what each middleware sent.
func logMatrix(t *testing.T, title string, results []limResult) {
	t.Helper()
	t.Logf("%s\n\n%s", title, limTable(results))
	logged := map[string]bool{}
	for _, r := range results {
		if !logged[r.middleware] {
			logged[r.middleware] = true
			t.Logf("%s headers (seen by the %s run):\n  %s", r.middleware, r.client, r.seen.describe())
		}
	}
}

// tableOnly reports whether LIMITERS_TABLE asks for the table without the
// assertions.
func tableOnly() bool { return os.Getenv("LIMITERS_TABLE") != "" }

// assertTargets checks that retryhttp, with its defaults, fetched nearly
// every page, cost the server few extra requests, and was not slow:
//
//   - at least targetMinFetched pages of limPages fetched;
//   - at most targetMaxPerPage requests received per page fetched;
//   - done within targetMaxTimeRatio times the ideal time (limIdeal).
//
// It reports every miss with the run's figures.
func assertTargets(t *testing.T, r limResult) {
	t.Helper()
	var misses []string
	if r.fetched < targetMinFetched {
		misses = append(misses, fmt.Sprintf("fetched %d pages, want >= %d", r.fetched, targetMinFetched))
	}
	if r.perPage() > targetMaxPerPage {
		misses = append(misses, fmt.Sprintf("%.2f requests a page, want <= %.2f", r.perPage(), targetMaxPerPage))
	}
	if r.ratio() > targetMaxTimeRatio {
		misses = append(misses, fmt.Sprintf("took %.1f s = %.2f x the ideal %v, want <= %.2f x",
			r.elapsed.Seconds(), r.ratio(), limIdeal, targetMaxTimeRatio))
	}
	if r.cut != "" {
		misses = append(misses, "run cut short: "+r.cut)
	}
	if len(misses) > 0 {
		t.Errorf("%s behind %s misses its targets: %s\n    (fetched %d/%d, %d requests, %.2f a page, %d refused, %d 429s handed back, %d errors, %.1f s; first error: %q)",
			r.client, r.middleware, strings.Join(misses, "; "),
			r.fetched, limPages, r.requests, r.perPage(), r.refused, r.statusBack, r.errs, r.elapsed.Seconds(), shorten(r.firstErr, 160))
	}
}

// assertRetryhttpTargets applies assertTargets to retryhttp's runs, unless
// LIMITERS_TABLE is set.
func assertRetryhttpTargets(t *testing.T, results []limResult) {
	t.Helper()
	if tableOnly() {
		t.Log("LIMITERS_TABLE is set: table only, targets not asserted")
		return
	}
	for _, r := range results {
		if r.client == "retryhttp" {
			assertTargets(t, r)
		}
	}
}

// TestLimiters runs 30 workers over 150 pages against each real
// rate-limiting middleware through each library, with default options,
// on a virtual clock; it logs the table (-v) and asserts retryhttp's
// targets (set LIMITERS_TABLE=1 to only print the table).
func TestLimiters(t *testing.T) {
	results := runMatrix(t, runVirtual)
	logMatrix(t, "Against real rate limiters (virtual time, in-memory network, ~1 ms latency):", results)
	assertRetryhttpTargets(t, results)
}
