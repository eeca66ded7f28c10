package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/PuerkitoBio/rehttp"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/retryhttp/retryhttp"
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
