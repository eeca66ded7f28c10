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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/retryhttp/retryhttp"
)

// This file is the harness of faults_scenarios_test.go: real net/http
// servers that fail the way production ones do (a broken replica, a
// concurrency limit, an outage, a dead address, a handler that hangs),
// each inside a testing/synctest bubble over the in-memory network of
// limiters_test.go, so seconds of traffic run in milliseconds of real time.
// Every library runs with its defaults, as in limiters_test.go, and
// retryhttp also with learning and the budget off (retryhttp-nolearn), the
// reference issue 16 measures the broken replica against.
//
//	go test -run TestFaults -v .                # the tables, retryhttp's targets asserted
//	LIMITERS_TABLE=1 go test -run TestFaults -v . # the tables only

// faultLatency is the network's round trip in every scenario, added to
// every request the server receives (the limiters' reference latency).
const faultLatency = time.Millisecond

// faultMaxRequests bounds what one run may send the server, and
// faultMaxDials the connection attempts of one run at a dead address:
// past either the run is cut, and says so.
const (
	faultMaxRequests = 30000
	faultMaxDials    = 20000
)

// faultClients are the libraries of limiters_test.go with their defaults,
// and retryhttp without learning or budget.
var faultClients = []limClient{
	{"retryhttp", newLimRetryhttp},
	{"retryhttp-nolearn", newFaultRetryhttpNoLearning},
	{"retryablehttp", newLimRetryablehttp},
	{"failsafehttp", newLimFailsafehttp},
	{"rehttp", newLimRehttp},
}

// newFaultRetryhttpNoLearning is retryhttp's defaults with
// WithLearning(false) and WithBudget(nil): every failure retried at full
// speed, nothing paced or handed back: the broken replica's reference.
func newFaultRetryhttpNoLearning(base http.RoundTripper) *http.Client {
	return retryhttp.NewClient(retryhttp.WithBase(base), retryhttp.WithLearning(false), retryhttp.WithBudget(nil))
}

// call is one caller's request, as the caller saw it.
type call struct {
	start, end time.Duration // since the run's start
	status     int           // the final answer's status; 0 on an error
	err        error
}

func (c call) dur() time.Duration { return c.end - c.start }

// ok reports whether the call ended in a 200 with its body read.
func (c call) ok() bool { return c.err == nil && c.status == http.StatusOK }

// unsent reports whether retryhttp handed the call back without sending
// it: the host down (ErrHostDown) or parked (ErrHostPaused).
func (c call) unsent() bool {
	return errors.Is(c.err, retryhttp.ErrHostDown) || errors.Is(c.err, retryhttp.ErrHostPaused)
}

// faultHost wraps a scenario's handler: it adds the network's latency,
// counts every request, and notes when each arrived and when each 200 was
// written, since the run's start.
type faultHost struct {
	start   time.Time
	next    http.Handler
	cancel  context.CancelFunc
	cut     atomic.Value // string: why the run was cut short
	mu      sync.Mutex
	arrived []time.Duration
	served  []time.Duration
}

func newFaultHost(next http.Handler, cancel context.CancelFunc) *faultHost {
	return &faultHost{start: time.Now(), next: next, cancel: cancel}
}

func (h *faultHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.arrived = append(h.arrived, time.Since(h.start))
	n := len(h.arrived)
	h.mu.Unlock()
	if n > faultMaxRequests {
		h.cut.CompareAndSwap(nil, fmt.Sprintf("more than %d requests", faultMaxRequests))
		h.cancel()
		http.Error(w, "request bound reached", http.StatusServiceUnavailable)
		return
	}
	time.Sleep(faultLatency)
	rec := &statusRecorder{ResponseWriter: w}
	h.next.ServeHTTP(rec, r)
	if rec.status == http.StatusOK {
		h.mu.Lock()
		h.served = append(h.served, time.Since(h.start))
		h.mu.Unlock()
	}
}

// requests is how many requests reached the host.
func (h *faultHost) requests() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.arrived)
}

// count is how many of times fall in [from, to).
func count(times []time.Duration, from, to time.Duration) int {
	n := 0
	for _, t := range times {
		if t >= from && t < to {
			n++
		}
	}
	return n
}

// faultRun is what a scenario's run gives its table: the calls, what the
// host saw, and the figures of the scenario's own columns.
type faultRun struct {
	client   string
	calls    []call
	requests int // requests the server received (dials, at a dead address)
	elapsed  time.Duration
	cut      string   // why the run was cut short, if it was
	figures  []string // the scenario's own columns
	data     any      // the scenario's own figures, for its check
	misses   []string // retryhttp's targets missed (only its own runs are checked)
}

func (r faultRun) fetched() int {
	n := 0
	for _, c := range r.calls {
		if c.ok() {
			n++
		}
	}
	return n
}

// errs is the calls that ended in an error; statusBack those whose final
// answer was a status other than 200.
func (r faultRun) errs() (errs, statusBack int) {
	for _, c := range r.calls {
		switch {
		case c.err != nil:
			errs++
		case c.status != http.StatusOK:
			statusBack++
		}
	}
	return errs, statusBack
}

// firstErr is the first error a call ended with, shortened.
func (r faultRun) firstErr() string {
	for _, c := range r.calls {
		if c.err != nil {
			return shorten(c.err.Error(), 160)
		}
	}
	return ""
}

// latencies returns the p50 and p99 of the durations of calls.
func latencies(calls []call) (p50, p99 time.Duration) {
	if len(calls) == 0 {
		return 0, 0
	}
	d := make([]time.Duration, len(calls))
	for i, c := range calls {
		d[i] = c.dur()
	}
	slices.Sort(d)
	at := func(p float64) time.Duration { return d[min(len(d)-1, int(math.Ceil(p*float64(len(d))))-1)] }
	return at(0.50), at(0.99)
}

// ms prints d in milliseconds, or seconds past 10 s.
func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

// inBubble runs f in a synctest bubble with an httptest server serving h
// over the in-memory network: f gets a pooled transport that dials it,
// the server's URL, and a context that h's host may cancel.
func inBubble(t *testing.T, deadline time.Duration, h func(cancel context.CancelFunc) *faultHost,
	f func(ctx context.Context, host *faultHost, base *http.Transport, url string)) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(limClockOffset)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		host := h(cancel)
		ts := httptest.NewUnstartedServer(host)
		ts.Listener.Close() // the loopback listener it made; this run stays in memory
		pl := newPipeListener("fault.test")
		ts.Listener = pl
		ts.Start()
		tr := cleanhttp.DefaultPooledTransport()
		tr.DialContext = pl.dial
		f(ctx, host, tr, ts.URL)
		tr.CloseIdleConnections()
		ts.Close()
	})
}

// closedLoop has workers take the pages 1..pages from one queue and GET
// each once through client; it returns every call. Nothing is retried
// here.
func closedLoop(ctx context.Context, client *http.Client, url string, workers, pages int, start time.Time) []call {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				page := next.Add(1)
				if page > int64(pages) {
					return
				}
				c := fetchOne(ctx, client, fmt.Sprintf("%s/page/%d", url, page), start)
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return calls
}

// fetchOne sends one GET through client and reads the answer whole.
func fetchOne(ctx context.Context, client *http.Client, url string, start time.Time) call {
	c := call{start: time.Since(start)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		panic(err)
	}
	resp, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.status = resp.StatusCode
	}
	c.err, c.end = err, time.Since(start)
	return c
}

// faultTable is the markdown table of one scenario's runs: the common
// columns, then the scenario's own (extra).
func faultTable(pages int, extra []string, runs []faultRun) string {
	var b strings.Builder
	b.WriteString("| library | fetched | requests | req/page | errors | status back | time |")
	for _, e := range extra {
		b.WriteString(" " + e + " |")
	}
	b.WriteString("\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for range extra {
		b.WriteString(" ---: |")
	}
	b.WriteString("\n")
	for _, r := range runs {
		if r.client == "" {
			continue // not run: -run left it out
		}
		errs, back := r.errs()
		fetched := fmt.Sprintf("%d", r.fetched())
		if pages > 0 {
			fetched += fmt.Sprintf(" / %d", pages)
		} else {
			fetched += fmt.Sprintf(" / %d", len(r.calls))
		}
		elapsed := fmt.Sprintf("%.2f s", r.elapsed.Seconds())
		if r.cut != "" {
			elapsed += " (cut: " + r.cut + ")"
		}
		name := r.client
		if len(r.misses) > 0 {
			name += " ✗"
		}
		perPage := "–"
		if r.fetched() > 0 {
			perPage = fmt.Sprintf("%.2f", float64(r.requests)/float64(r.fetched()))
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %d | %d | %s |", name, fetched, r.requests, perPage, errs, back, elapsed)
		for _, f := range r.figures {
			b.WriteString(" " + f + " |")
		}
		b.WriteString("\n")
	}
	for _, r := range runs {
		if e := r.firstErr(); e != "" {
			fmt.Fprintf(&b, "\n%s first error: %s", r.client, e)
		}
	}
	return b.String()
}

// runFaults runs scenario with every client in parallel subtests, then
// check on retryhttp's run (with every run, for a target relative to
// another), logs the table under title, and fails t on retryhttp's misses
// unless LIMITERS_TABLE is set or the miss is known (knownFaultMisses, by
// key; LIMITERS_STRICT asserts those too).
func runFaults(t *testing.T, key, title string, pages int, extra []string,
	scenario func(t *testing.T, lc limClient) faultRun, check func(r faultRun, all []faultRun) []string) []faultRun {
	t.Helper()
	runs := make([]faultRun, len(faultClients))
	t.Run("runs", func(t *testing.T) {
		for i, lc := range faultClients {
			t.Run(lc.name, func(t *testing.T) {
				t.Parallel()
				skipUnderRace(t, lc.name)
				runs[i] = scenario(t, lc)
				runs[i].client = lc.name
			})
		}
	})
	for i := range runs {
		if runs[i].client == "retryhttp" {
			runs[i].misses = check(runs[i], runs)
			if runs[i].cut != "" {
				runs[i].misses = append(runs[i].misses, "run cut short: "+runs[i].cut)
			}
		}
	}
	t.Logf("%s\n\n%s", title, faultTable(pages, extra, runs))
	if tableOnly() {
		t.Log("LIMITERS_TABLE is set: table only, targets not asserted")
		return runs
	}
	for _, r := range runs {
		if r.client != "retryhttp" {
			continue
		}
		known, isKnown := knownFaultMisses[key]
		switch {
		case len(r.misses) == 0:
			if isKnown {
				t.Logf("known miss met in this run (remove %q from knownFaultMisses once it is met every run)", key)
			}
		case isKnown && os.Getenv("LIMITERS_STRICT") == "":
			t.Skipf("known miss: %s (recorded: %s)", strings.Join(r.misses, "; "), known)
		default:
			t.Errorf("retryhttp misses its targets (%s): %s", key, strings.Join(r.misses, "; "))
		}
	}
	return runs
}

// byName returns the run of the named client.
func byName(runs []faultRun, name string) faultRun {
	for _, r := range runs {
		if r.client == name {
			return r
		}
	}
	panic("no run of " + name)
}

// knownFaultMisses are the scenarios, by the key runFaults is given, where
// retryhttp misses a target of issue 16 in some runs: measured and
// printed, their assertion skipped when they miss (t.Skip, "known miss")
// unless LIMITERS_STRICT is set. Each value is what those runs gave. None
// is known now: the outage's return at the old rate and every page a
// broken replica's tries can get are met in every run (the host model's
// pace before the outage's run, the budget refunding the retries of a
// request that succeeds).
var knownFaultMisses = map[string]string{}

// refusedDial is a dead address: every connection attempt is refused, as
// the kernel refuses one to a closed port, with the *net.OpError (Op
// "dial") wrapping ECONNREFUSED that net.Dialer returns, after the
// network's round trip (the RST's). It counts the attempts, by when they
// were made.
type refusedDial struct {
	start  time.Time
	cancel context.CancelFunc
	cut    atomic.Value
	mu     sync.Mutex
	dials  []time.Duration
}

func (d *refusedDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, time.Since(d.start))
	n := len(d.dials)
	d.mu.Unlock()
	if n > faultMaxDials {
		d.cut.CompareAndSwap(nil, fmt.Sprintf("more than %d dials", faultMaxDials))
		d.cancel()
	}
	select {
	case <-time.After(faultLatency):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, &net.OpError{Op: "dial", Net: network, Addr: deadAddr(addr),
		Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

type deadAddr string

func (deadAddr) Network() string  { return "tcp" }
func (a deadAddr) String() string { return string(a) }
