package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
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
	"github.com/didip/tollbooth/v7"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/go-chi/httprate"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/retryhttp/retryhttp"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululestdlib "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululememory "github.com/ulule/limiter/v3/drivers/store/memory"
)

// This file is the proof harness for per-host adaptive pacing: workers
// fetch pages from a server guarded by a real rate-limiting middleware of
// the Go ecosystem, through each library with its default options.
// TestLimiters runs every middleware x library pair in the reference cell
// (30 workers, 150 pages, 10 requests a second, 1 ms of latency) inside a
// testing/synctest bubble, over an in-memory network, so the middlewares'
// clocks and every library's sleeps are virtual: a 20-second run takes a
// fraction of a second of real time. limiters_matrix_test.go runs the same
// pairs at other worker counts, quotas and latencies; limiters_net_test.go
// runs the reference cell over real loopback on the real clock, on request
// only.
//
//	go test -run 'TestLimiters$' -v .                  # the table, and retryhttp's targets asserted
//	LIMITERS_TABLE=1 go test -run 'TestLimiters$' -v . # the table only, nothing asserted
//	LIMITERS_LOOPBACK=1 go test -run TestLimitersLoopback -v -parallel 8 .

// The workload of every cell.
const (
	limPages       = 150                  // pages to fetch, one GET each, from a shared queue
	limService     = 5 * time.Millisecond // the guarded handler's service time
	limMinDeadline = 120 * time.Second    // least bound on one run (virtual inside a bubble)
	limMaxRequests = 20000                // bound on the requests of one run: past it the run is cut
)

// A limQuota is what a middleware is told to allow: limit requests per
// window, and for the token buckets (throttled's GCRA, tollbooth) a burst.
// A window limiter (httprate, ulule) has no burst: it allows limit at once
// at the start of a window whatever burst says.
type limQuota struct {
	name   string // without a slash: it names subtests
	limit  int
	window time.Duration
	burst  int // a token bucket's burst; 0: limit, a window's worth
}

// rate is the quota's long-run rate, in requests a second.
func (q limQuota) rate() float64 { return float64(q.limit) / q.window.Seconds() }

// bucket is the burst a token bucket is given for q.
func (q limQuota) bucket() int {
	if q.burst > 0 {
		return q.burst
	}
	return q.limit
}

// The quotas of the matrix; quota10 is the reference cell's.
var (
	quota10      = limQuota{"10per1s", 10, time.Second, 0}
	quota100     = limQuota{"100per10s", 100, 10 * time.Second, 0}
	quota5Burst  = limQuota{"5per1s-burst20", 5, time.Second, 20}
	quota60PerMn = limQuota{"60per1min", 60, time.Minute, 0}
	limQuotas    = []limQuota{quota10, quota100, quota5Burst, quota60PerMn}
)

// A limCell is one point of the matrix: how many workers, against which
// quota, over how much network latency.
type limCell struct {
	workers int
	quota   limQuota
	latency time.Duration // added to every request, refused ones too: the network's round trip
}

// refCell is the reference cell of TestLimiters and the README's first
// table.
var refCell = limCell{workers: 30, quota: quota10, latency: time.Millisecond}

func (c limCell) String() string {
	return fmt.Sprintf("%s/w%d/%v", c.quota.name, c.workers, c.latency)
}

// ideal is the least time the pages can take: at the quota's rate, or, for
// few workers, one request after the other at the round trip (latency and
// service time): max(pages/rate, pages*(latency+service)/workers). A burst
// (a token bucket's, or a window's first allowance) lets a client finish
// a little sooner than pages/rate; the ideal does not count on it.
func (c limCell) ideal() time.Duration {
	byRate := time.Duration(float64(limPages) / c.quota.rate() * float64(time.Second))
	byLatency := time.Duration(limPages) * (c.latency + limService) / time.Duration(c.workers)
	return max(byRate, byLatency)
}

// deadline bounds one run: five ideal times, and never less than
// limMinDeadline.
func (c limCell) deadline() time.Duration { return max(limMinDeadline, 5*c.ideal()) }

// floorRequests is the fewest requests a client that knows nothing of the
// host can send: every page once, and every first try of the opening
// burst beyond what the middleware allows at once (nothing can know the
// quota before the first answer, and a host that never failed is not
// paced).
func (c limCell) floorRequests(mw limMiddleware) int {
	return limPages + max(0, min(c.workers, limPages)-mw.allowance(c.quota))
}

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
	targetMinFetched   = limPages // every page
	targetMaxPerPage   = 1.2      // requests the server received per page fetched
	targetMaxTimeRatio = 1.2      // time to fetch everything over the cell's ideal
)

// A limMiddleware guards a handler the way a service would use it. make is
// called inside the run's bubble, so the limiter's clock is the bubble's.
type limMiddleware struct {
	name   string
	bucket bool // a token bucket (it takes a burst), not a window
	make   func(q limQuota, next http.Handler) http.Handler
}

// allowance is what the middleware lets through at once, fresh: a token
// bucket its burst, a window its limit.
func (mw limMiddleware) allowance(q limQuota) int {
	if mw.bucket {
		return q.bucket()
	}
	return q.limit
}

var limMiddlewares = []limMiddleware{
	{"httprate", false, newHTTPRate},
	{"throttled", true, newThrottled},
	{"tollbooth", true, newTollbooth},
	{"ulule", false, newUlule},
}

// newHTTPRate is go-chi/httprate v0.16.1, limit requests per window for
// everyone: LimitBy with the constant key, which is exactly what its
// (deprecated) LimitAll does; with a single client it is also what
// LimitByIP does. A sliding-window counter: it sends X-RateLimit-Limit,
// -Remaining and -Reset (the end of the current window as a Unix time) on
// every answer, and Retry-After (the window length, in seconds) on a 429.
func newHTTPRate(q limQuota, next http.Handler) http.Handler {
	return httprate.LimitBy(q.limit, q.window, httprate.Key("*"))(next)
}

// newThrottled is throttled/throttled v2.15.0: HTTPRateLimiterCtx over a
// GCRA limiter in its memstore, PerDuration(limit, window) with MaxBurst
// bucket-1 (MaxBurst counts the requests beyond the first, so a burst of
// bucket and X-RateLimit-Limit: bucket), VaryBy nil (one key for
// everyone). It sends X-RateLimit-Limit, -Remaining and -Reset (seconds
// until the bucket is full again, rounded up) on every answer, and
// Retry-After (seconds until one more request is allowed, rounded up) on a
// 429.
func newThrottled(q limQuota, next http.Handler) http.Handler {
	store, err := memstore.NewCtx(65536)
	if err != nil {
		panic(err)
	}
	limiter, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{MaxRate: throttled.PerDuration(q.limit, q.window), MaxBurst: q.bucket() - 1})
	if err != nil {
		panic(err)
	}
	h := &throttled.HTTPRateLimiterCtx{RateLimiter: limiter}
	return h.RateLimit(next)
}

// newTollbooth is didip/tollbooth v7.0.2 (v8 is not on the module proxy
// here): LimitHandler over NewLimiter(rate per second), a token bucket per
// key (a copy of x/time/rate), with SetBurst(bucket) and SetIgnoreURL(true).
// Its default key is the client's IP and the request's path: with one page
// a path, that would give every page a bucket of its own and limit
// nothing, so the URL is left out, as a service limiting its clients does.
// Every answer carries X-Rate-Limit-Limit (the rate, "10.00"),
// X-Rate-Limit-Duration: 1, X-Rate-Limit-Request-Remote-Addr, and the IETF
// draft's RateLimit-Limit (the rate per second, rounded), RateLimit-Reset:
// 1 (always) and RateLimit-Remaining (the whole tokens left, 0 on a 429).
// A 429 says "You have reached maximum request limit." with no
// Retry-After.
func newTollbooth(q limQuota, next http.Handler) http.Handler {
	lmt := tollbooth.NewLimiter(q.rate(), nil).SetBurst(q.bucket()).SetIgnoreURL(true)
	return tollbooth.LimitHandler(lmt, next)
}

// newUlule is ulule/limiter v3.11.2: its stdlib middleware over its memory
// store, Rate{Limit: limit, Period: window}, keyed by the client's IP (the
// default KeyGetter). A fixed window that starts with the first request
// of a key and ends a period later (not aligned to the clock); refused
// requests count too. Every answer carries X-RateLimit-Limit,
// -Remaining and -Reset (the window's end as a Unix time, truncated to the
// second); a 429 says "Limit exceeded" with no Retry-After. The store is
// made with CleanUpInterval 0, which starts no cleaner: its default (30 s)
// starts a goroutine on a ticker that only a finalizer stops, which would
// keep a synctest bubble alive for ever. The counters still expire when
// read, which is all the limiter needs.
func newUlule(q limQuota, next http.Handler) http.Handler {
	store := ululememory.NewStoreWithOptions(ulule.StoreOptions{Prefix: ulule.DefaultPrefix, CleanUpInterval: 0})
	lmt := ulule.New(store, ulule.Rate{Formatted: q.name, Period: q.window, Limit: int64(q.limit)})
	return ululestdlib.NewMiddleware(lmt).Handler(next)
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

// skipUnderRace skips a run of a failsafe-go client in a synctest bubble
// under the race detector. There the Go runtime (go1.26.8) crashes with a
// SIGSEGV in runtime.(*timer).maybeRunChan, on failsafe-go's retry timer
// (retryexecutor.go:73): 6 of 20 race runs of the dead address alone,
// and in the matrix; never in 20 runs without -race, nor on any other
// client's goroutine. A crash takes the whole test binary down, so these
// runs are left to plain runs (the READMEs' tables come from those).
func skipUnderRace(t *testing.T, client string) {
	t.Helper()
	if failsafeSkipped(client) {
		t.Skipf("%s in a synctest bubble crashes the Go runtime under -race (timer.maybeRunChan); its figures come from runs without -race", client)
	}
}

// failsafeSkipped reports whether client's runs are skipped in this build.
func failsafeSkipped(client string) bool {
	return raceEnabled && strings.HasPrefix(client, "failsafehttp")
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
	return &http.Client{Transport: failsafehttp.NewRoundTripper(base, failsafeRetryPolicy())}
}

// failsafeRetryPolicy is newLimFailsafehttp's retry policy: failsafehttp's
// NewRetryPolicyBuilder() with its defaults and the two closing listeners.
func failsafeRetryPolicy() retrypolicy.RetryPolicy[*http.Response] {
	return failsafehttp.NewRetryPolicyBuilder().
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
	cell               limCell
	floor              int           // the fewest requests the cell allows (floorRequests)
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

// ratio is the run's time over the cell's ideal time.
func (r limResult) ratio() float64 { return r.elapsed.Seconds() / r.cell.ideal().Seconds() }

// limHeaders keeps the rate-limit headers of the first 200 and the first
// 429 a run saw, and every distinct Retry-After value sent with a 429.
type limHeaders struct {
	mu          sync.Mutex
	ok, refused http.Header
	retryAfter  []string
}

var limHeaderNames = []string{
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Increment",
	"X-Rate-Limit-Limit", "X-Rate-Limit-Duration",
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

func newLimServer(mw limMiddleware, cell limCell, cancel context.CancelFunc) *limServer {
	s := &limServer{cancel: cancel}
	guarded := mw.make(cell.quota, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		time.Sleep(cell.latency)
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

// fetchAll is the client side of a run: workers take page numbers from
// one queue and send one GET each through client; a page is fetched when
// the final answer is a 200 with its body. Nothing is retried here: a
// status other than 200, or an error, leaves the page unfetched.
func fetchAll(ctx context.Context, client *http.Client, url string, workers int, srv *limServer) limResult {
	var (
		next                       atomic.Int64
		fetched, statusBack, nerrs atomic.Int64
		firstErr                   atomic.Value
		wg                         sync.WaitGroup
	)
	start := time.Now()
	for range workers {
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
		r.cut = "the run's deadline"
	}
	return r
}

// runVirtual runs one middleware x library pair in one cell inside a
// synctest bubble: an httptest server on an in-memory pipe listener, a
// pooled transport whose DialContext dials that listener, the library
// around it. Every clock involved is the bubble's, so the run is fast, and
// exact but for the order in which the bubble's goroutines run.
func runVirtual(t *testing.T, cell limCell, mw limMiddleware, lc limClient) limResult {
	skipUnderRace(t, lc.name)
	var res limResult
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(limClockOffset)
		ctx, cancel := context.WithTimeout(context.Background(), cell.deadline())
		defer cancel()
		srv := newLimServer(mw, cell, cancel)
		ts := httptest.NewUnstartedServer(srv.handler)
		ts.Listener.Close() // the loopback listener it made; this run stays in memory
		pl := newPipeListener("limited.test")
		ts.Listener = pl
		ts.Start()
		tr := cleanhttp.DefaultPooledTransport()
		tr.DialContext = pl.dial
		res = fetchAll(ctx, lc.make(tr), ts.URL, cell.workers, srv)
		tr.CloseIdleConnections()
		ts.Close()
		res.middleware, res.client, res.cell = mw.name, lc.name, cell
		res.floor = cell.floorRequests(mw)
		res.seen = &srv.seen
	})
	return res
}

// pipeListener is an in-memory network for a synctest bubble: each dial
// makes a net.Pipe and hands one end to Accept. net.Pipe blocks durably, so
// virtual time advances while both sides wait. The server's end says it
// comes from 127.0.0.1 (a port a connection), as a loopback client would:
// tollbooth and ulule key their limits by the client's IP, and a pipe's
// own address ("pipe") is none.
type pipeListener struct {
	addr  string
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	ports atomic.Int32
}

func newPipeListener(addr string) *pipeListener {
	return &pipeListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	from := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000 + int(l.ports.Add(1)%20000)}
	select {
	case l.conns <- fromConn{s, from}:
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

// fromConn is the server's end of a pipe, with the client's address.
type fromConn struct {
	net.Conn
	from net.Addr
}

func (c fromConn) RemoteAddr() net.Addr { return c.from }

// runMatrix runs every middleware x library pair in cell with run, in
// parallel subtests, and returns the results in the order of
// limMiddlewares and limClients.
func runMatrix(t *testing.T, cell limCell, run func(*testing.T, limCell, limMiddleware, limClient) limResult) []limResult {
	results := make([]limResult, len(limMiddlewares)*len(limClients))
	t.Run("runs", func(t *testing.T) {
		for i, mw := range limMiddlewares {
			for j, lc := range limClients {
				t.Run(mw.name+"/"+lc.name, func(t *testing.T) {
					t.Parallel()
					results[i*len(limClients)+j] = run(t, cell, mw, lc)
				})
			}
		}
	})
	return results
}

// limTable is the markdown table of one cell's results.
func limTable(cell limCell, results []limResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d workers, %d pages, %d req per %v allowed, %v latency, ideal time %v\n\n",
		cell.workers, limPages, cell.quota.limit, cell.quota.window, cell.latency, cell.ideal())
	b.WriteString("| middleware | library | fetched | requests | req/page | refused (429) | 429 back | errors | time | ideal | ratio |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		if r.client == "" {
			continue // not run: -run left it out
		}
		elapsed := fmt.Sprintf("%.1f s", r.elapsed.Seconds())
		if r.cut != "" {
			elapsed += " (cut: " + r.cut + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f | %d | %d | %d | %s | %s | %.2f |\n",
			r.middleware, r.client, r.fetched, r.requests, r.perPage(), r.refused, r.statusBack, r.errs,
			elapsed, seconds(r.cell.ideal()), r.ratio())
	}
	for _, r := range results {
		if r.firstErr != "" {
			fmt.Fprintf(&b, "\n%s/%s first error: %s", r.middleware, r.client, shorten(r.firstErr, 160))
		}
	}
	return b.String()
}

// seconds prints d in seconds, without a fraction when it has none.
func seconds(d time.Duration) string {
	s := d.Seconds()
	if s == math.Trunc(s) {
		return fmt.Sprintf("%.0f s", s)
	}
	return fmt.Sprintf("%.2f s", s)
}

// shorten cuts s to at most n bytes, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// logMatrix logs the table and what each middleware sent.
func logMatrix(t *testing.T, title string, cell limCell, results []limResult) {
	t.Helper()
	t.Logf("%s\n\n%s", title, limTable(cell, results))
	logged := map[string]bool{}
	for _, r := range results {
		if r.client != "" && !logged[r.middleware] {
			logged[r.middleware] = true
			t.Logf("%s headers (seen by the %s run):\n  %s", r.middleware, r.client, r.seen.describe())
		}
	}
}

// tableOnly reports whether LIMITERS_TABLE asks for the table without the
// assertions.
func tableOnly() bool { return os.Getenv("LIMITERS_TABLE") != "" }

// misses lists the targets a retryhttp run missed:
//
//   - every page fetched (targetMinFetched);
//   - at most targetMaxPerPage requests received per page fetched, where a
//     client can reach it (perPageReachable): not where even the cell's
//     floor (floorRequests: the opening burst refused) is over it;
//   - done within targetMaxTimeRatio times the cell's ideal time.
func misses(r limResult) []string {
	var out []string
	if r.fetched < targetMinFetched {
		out = append(out, fmt.Sprintf("fetched %d pages, want %d", r.fetched, targetMinFetched))
	}
	if r.perPageReachable() && r.perPage() > targetMaxPerPage {
		out = append(out, fmt.Sprintf("%.2f requests a page, want <= %.2f", r.perPage(), targetMaxPerPage))
	}
	if r.ratio() > targetMaxTimeRatio {
		out = append(out, fmt.Sprintf("took %.1f s = %.2f x the ideal %v, want <= %.2f x",
			r.elapsed.Seconds(), r.ratio(), r.cell.ideal(), targetMaxTimeRatio))
	}
	if r.cut != "" {
		out = append(out, "run cut short: "+r.cut)
	}
	return out
}

// perPageReachable reports whether any client could keep within
// targetMaxPerPage in the run's cell: whether the cell's floor is within
// it. With 100 workers and 10 allowed at once, 90 first tries are refused
// before any answer could tell the client so: 240 requests for 150 pages
// at the least, 1.60 a page.
func (r limResult) perPageReachable() bool {
	return float64(r.floor) <= targetMaxPerPage*limPages
}

// figures is a run's numbers, for a failure's message.
func (r limResult) figures() string {
	return fmt.Sprintf("fetched %d/%d, %d requests, %.2f a page (floor %.2f), %d refused, %d 429s handed back, %d errors, %.1f s = %.2f x the ideal %v; first error: %q",
		r.fetched, limPages, r.requests, r.perPage(), float64(r.floor)/limPages, r.refused, r.statusBack, r.errs,
		r.elapsed.Seconds(), r.ratio(), r.cell.ideal(), shorten(r.firstErr, 160))
}

// assertRetryhttpTargets applies assertCell to retryhttp's runs of
// runMatrix, which run made, unless LIMITERS_TABLE is set.
func assertRetryhttpTargets(t *testing.T, results []limResult, run func(*testing.T, limCell, limMiddleware, limClient) limResult) {
	t.Helper()
	if tableOnly() {
		t.Log("LIMITERS_TABLE is set: table only, targets not asserted")
		return
	}
	for i, r := range results {
		if r.client == "retryhttp" {
			mw, lc := limMiddlewares[i/len(limClients)], limClients[i%len(limClients)]
			assertCell(t, r, func(t *testing.T) limResult { return run(t, r.cell, mw, lc) })
		}
	}
}

// TestLimiters runs the reference cell (30 workers over 150 pages, 10
// requests a second allowed, 1 ms of latency) against each real
// rate-limiting middleware through each library, with default options, on
// a virtual clock; it logs the table (-v) and asserts retryhttp's targets
// (set LIMITERS_TABLE=1 to only print the table).
func TestLimiters(t *testing.T) {
	results := runMatrix(t, refCell, runVirtual)
	logMatrix(t, "Against real rate limiters (virtual time, in-memory network, ~1 ms latency):", refCell, results)
	assertRetryhttpTargets(t, results, runVirtual)
}
