package retryhttp

// The soak: many goroutines, one Transport, a server that fails a random
// 30 % of what it gets. Issue 4. Helpers are named rel*, like those of
// reliability_*_test.go.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relSoakServer fails a random share of requests: a third with a 429 and
// Retry-After: 0, a third with a 503, a sixth by cutting the connection in
// the middle of the response headers, a sixth by resetting it before any
// answer. It counts every arrival of each request id, and every body whose
// hash is not the one the client announced.
type relSoakServer struct {
	failShare float64

	mu      sync.Mutex
	arrived map[int][]bool // request id -> each arrival: acted on or not (429)

	badBody atomic.Int64
	cut     atomic.Int64
	reset   atomic.Int64
}

func (s *relSoakServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.Header.Get("X-Rel-Id"))
	if err != nil {
		http.Error(w, "no id", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(r.Body)
	sum := sha256.Sum256(body)
	if err != nil || hex.EncodeToString(sum[:]) != r.Header.Get("X-Rel-Sum") {
		s.badBody.Add(1)
	}
	x := rand.Float64()
	// A 429 says the request was not acted on; every other answer, and a
	// connection cut, may follow an execution.
	acted := !(x < s.failShare/3)
	s.mu.Lock()
	s.arrived[id] = append(s.arrived[id], acted)
	s.mu.Unlock()

	switch {
	case x < s.failShare/3:
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
	case x < 2*s.failShare/3:
		w.WriteHeader(http.StatusServiceUnavailable)
	case x < 5*s.failShare/6:
		// Cut the connection after the status line, before the headers
		// end: the client gets an unexpected EOF.
		s.cut.Add(1)
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		bw.WriteString("HTTP/1.1 503 Service Unavailable\r\n")
		bw.Flush()
		conn.Close()
	case x < s.failShare:
		// Reset the connection before answering: the client gets
		// ECONNRESET, and net/http may replay an idempotent request on its
		// own when the connection was a reused one.
		s.reset.Add(1)
		relHijackReset(w)
	default:
		w.Header().Set("X-Rel-Sum", hex.EncodeToString(sum[:]))
		w.Write([]byte("ok"))
	}
}

// relSoakStats is what the client saw.
type relSoakStats struct {
	ok, finalStatus, failed, paused atomic.Int64
	wrong                           atomic.Int64 // an answer or error of a kind no fault explains
	retries                         atomic.Int64 // OnRetry events with a retry following
	refused                         sync.Map     // reason -> *atomic.Int64
	perRequest                      sync.Map     // *http.Request -> *atomic.Int64: its retries
	unpaid                          atomic.Int64 // retries that got no answer worth having: what the budget pays for
}

// settle counts what a request's retries cost the budget: all but the
// last when the last got its answer (a retry that succeeds pays for
// itself).
func (st *relSoakStats) settle(req *http.Request, answered bool) {
	v, ok := st.perRequest.LoadAndDelete(req)
	if !ok {
		return
	}
	n := v.(*atomic.Int64).Load()
	if answered {
		n--
	}
	st.unpaid.Add(n)
}

func (st *relSoakStats) refusedCounts() map[string]int64 {
	out := make(map[string]int64)
	st.refused.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// relSoakRun sends n requests from workers goroutines through tr, ids
// from firstID on: GETs, PUTs with a body, keyed and unkeyed POSTs with a
// body, in turn.
func relSoakRun(t *testing.T, tr *Transport, url string, firstID, n, workers int, st *relSoakStats) {
	t.Helper()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for id := range jobs {
				relSoakOne(t, tr, url, id, st)
			}
		})
	}
	done := make(chan struct{})
	go func() {
		for id := firstID; id < firstID+n; id++ {
			jobs <- id
		}
		close(jobs)
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the soak did not end: %d ok, %d failed so far", st.ok.Load(), st.failed.Load())
	}
}

func relSoakOne(t *testing.T, tr *Transport, url string, id int, st *relSoakStats) {
	var body []byte
	method := http.MethodGet
	switch id % 4 {
	case 1:
		method = http.MethodPut
	case 2, 3:
		method = http.MethodPost
	}
	if method != http.MethodGet {
		body = make([]byte, rand.IntN(4096))
		for i := range body {
			body[i] = byte(rand.Uint32())
		}
	}
	sum := sha256.Sum256(body)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url+"/soak/"+strconv.Itoa(id), bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	if body == nil {
		req.Body, req.GetBody, req.ContentLength = nil, nil, 0
	}
	req.Header.Set("X-Rel-Id", strconv.Itoa(id))
	req.Header.Set("X-Rel-Sum", hex.EncodeToString(sum[:]))
	if id%4 == 2 {
		req.Header.Set("Idempotency-Key", "soak-"+strconv.Itoa(id))
	}
	resp, err := tr.RoundTrip(req)
	answered := false
	defer func() { st.settle(req, answered) }()
	if err != nil {
		var re *RetryError
		switch {
		case errors.Is(err, ErrHostPaused):
			st.paused.Add(1)
		case errors.As(err, &re) && transientError(context.Background(), re.Err):
			st.failed.Add(1)
		default:
			st.wrong.Add(1)
			t.Errorf("request %d: unexpected error %v", id, err)
		}
		return
	}
	defer resp.Body.Close()
	got, rerr := io.ReadAll(resp.Body)
	switch {
	case resp.StatusCode == http.StatusOK && rerr == nil && string(got) == "ok" && resp.Header.Get("X-Rel-Sum") == hex.EncodeToString(sum[:]):
		st.ok.Add(1)
		answered = true
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		st.finalStatus.Add(1)
	default:
		st.wrong.Add(1)
		t.Errorf("request %d: status %d, body %q, read error %v", id, resp.StatusCode, got, rerr)
	}
}

// relReplayCounter wraps an *http.Transport and counts the connections it
// asks for (httptrace GetConn) against the round trips it is given: the
// difference is the requests net/http replayed on its own, which it does
// for an idempotent request whose reused connection died before the first
// byte of the answer.
type relReplayCounter struct {
	base            *http.Transport
	calls, getConns atomic.Int64
}

func (c *relReplayCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.calls.Add(1)
	trace := &httptrace.ClientTrace{GetConn: func(string) { c.getConns.Add(1) }}
	return c.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
}

func (c *relReplayCounter) replays() int64 { return c.getConns.Load() - c.calls.Load() }

// relHeapAfterGC returns the live heap once the garbage is collected.
func relHeapAfterGC() uint64 {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestReliabilitySoak sends 20,000 requests from 200 goroutines through
// one Transport (default budget, waits of a few milliseconds) to a server
// that fails 30 % of what it gets. Every request ends with an answer or an
// error a fault explains; every body that reached the server is the one
// sent; no unkeyed POST is executed twice; the repeats the server sees
// are exactly the Transport's retries, and they keep to the budget's
// share; and the Transport's memory does not grow with a second run.
func TestReliabilitySoak(t *testing.T) {
	requests, workers := 20_000, 200
	if testing.Short() {
		requests = 4_000
	}
	relNoLeaks(t)
	srv := &relSoakServer{failShare: 0.3, arrived: make(map[int][]bool)}
	ts := relStart(t, srv, relServerOpts{})
	base := &http.Transport{MaxIdleConnsPerHost: workers, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(base.CloseIdleConnections)
	counter := &relReplayCounter{base: base}

	var st relSoakStats
	tr := New(
		WithBase(counter),
		// Its failures do not depend on load, which learning would take for
		// overload and pace down; the soak is about the rest.
		WithLearning(false),
		WithBackoff(time.Millisecond, 5*time.Millisecond),
		WithRetryAfterLimits(time.Millisecond, 5*time.Millisecond),
		onEvents(func(ev RetryEvent) {
			if ev.Reason == "" {
				st.retries.Add(1)
				v, _ := st.perRequest.LoadOrStore(ev.Request, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
				return
			}
			v, _ := st.refused.LoadOrStore(string(ev.Reason), new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}),
	)

	start := time.Now()
	relSoakRun(t, tr, ts.URL, 0, requests, workers, &st)
	elapsed := time.Since(start)

	ended := st.ok.Load() + st.finalStatus.Load() + st.failed.Load() + st.paused.Load() + st.wrong.Load()
	t.Logf("%d requests in %v (%.0f/s): %d ok, %d final 429/503, %d transport errors, %d host paused; the server cut %d and reset %d",
		requests, elapsed.Round(time.Millisecond), float64(requests)/elapsed.Seconds(),
		st.ok.Load(), st.finalStatus.Load(), st.failed.Load(), st.paused.Load(), srv.cut.Load(), srv.reset.Load())
	if ended != int64(requests) {
		t.Errorf("%d of %d requests ended", ended, requests)
	}
	if n := st.wrong.Load(); n != 0 {
		t.Errorf("%d requests ended in a way no fault explains", n)
	}
	if n := srv.badBody.Load(); n != 0 {
		t.Errorf("%d bodies reached the server altered", n)
	}

	// Repeats, from the server's side.
	srv.mu.Lock()
	firsts, repeats, unkeyedTwice := 0, 0, 0
	for id, arrivals := range srv.arrived {
		firsts++
		repeats += len(arrivals) - 1
		acted := 0
		for _, a := range arrivals {
			if a {
				acted++
			}
		}
		if id%4 == 3 && acted > 1 {
			unkeyedTwice++
		}
	}
	srv.mu.Unlock()
	clientRetries := st.retries.Load()
	replays := counter.replays()
	// The budget: 10 % of first tries over any 10 s, plus 10 retries per
	// 10 s in reserve, for the retries that did not pay for themselves (a
	// retry that succeeds is refunded). A run inside ten seconds is one
	// window and the bound is exact. A longer one (a loaded machine) is counted in whole
	// windows, with 2 % of first tries to spare: the budget's window
	// slides, so a window's retries are bounded by first tries that may
	// partly fall in the window before, which matters only if the load is
	// uneven.
	span := time.Now().Unix() - start.Unix()
	windows := int(span)/10 + 1
	allowed := firsts/10 + 10*windows
	if span >= 10 {
		allowed += firsts / 50
	}
	unpaid := st.unpaid.Load()
	t.Logf("server saw %d first tries and %d repeats (%.1f %%): %d retries by the Transport, %d of them unpaid (budget allows %d), %d replays by net/http itself; refused: %v",
		firsts, repeats, 100*float64(repeats)/float64(firsts), clientRetries, unpaid, allowed, replays, st.refusedCounts())
	if firsts != requests {
		t.Errorf("server saw %d distinct requests, want %d", firsts, requests)
	}
	if unkeyedTwice != 0 {
		t.Errorf("%d POSTs without a key were executed more than once", unkeyedTwice)
	}
	if int64(repeats) != clientRetries+replays {
		t.Errorf("server saw %d repeats; the Transport made %d retries and net/http %d replays", repeats, clientRetries, replays)
	}
	if unpaid > int64(allowed) {
		t.Errorf("%d retries unpaid, more than the budget's %d", unpaid, allowed)
	}
	if clientRetries < int64(firsts/20) {
		t.Errorf("only %d retries for %d requests: the budget was not used", clientRetries, firsts)
	}

	// Memory: a second run through the same Transport leaves its heap
	// where the first left it.
	base.CloseIdleConnections()
	heap1 := relHeapAfterGC()
	second := requests / 4
	relSoakRun(t, tr, ts.URL, requests, second, workers, &st)
	base.CloseIdleConnections()
	srv.mu.Lock()
	clear(srv.arrived) // the server's own bookkeeping is not the Transport's
	srv.mu.Unlock()
	heap2 := relHeapAfterGC()
	hosts := relHostEntries(tr)
	t.Logf("heap after GC: %d KiB after the first run, %d KiB after a second of %d requests; %d host entries held",
		heap1>>10, heap2>>10, second, hosts)
	if heap2 > heap1+4<<20 {
		t.Errorf("heap grew from %d to %d bytes over a second run", heap1, heap2)
	}
	if hosts > 1 {
		t.Errorf("%d host entries for one host", hosts)
	}
}
