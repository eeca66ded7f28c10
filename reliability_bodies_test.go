package retryhttp

// Reliability of response bodies and headers: a retried response is
// drained and its connection reused, a large or slow one is dropped
// without being read or waited on, and a megabyte of Retry-After or
// RateLimit is neither trusted nor costly. Issue 4.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Connections and bodies: a retried response is drained and its connection
// reused; a large one is dropped without being read.

func TestReliabilityRetriedResponseConnections(t *testing.T) {
	cases := []struct {
		name      string
		body      int  // bytes of each 503's body
		chunked   bool // send it without a Content-Length
		wantConns int  // server connections for the three tries
	}{
		{name: "small body reuses the connection", body: 512, wantConns: 1},
		{name: "small chunked body reuses the connection", body: 512, chunked: true, wantConns: 1},
		{name: "64 KiB body reuses the connection", body: 64 << 10, wantConns: 1},
		{name: "64 KiB chunked body reuses the connection", body: 64 << 10, chunked: true, wantConns: 1},
		{name: "large body is dropped with its connection", body: 256 << 10, wantConns: 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			relNoLeaks(t)
			var n atomic.Int64
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 3 {
					w.Write([]byte("ok"))
					return
				}
				if !c.chunked {
					w.Header().Set("Content-Length", fmt.Sprint(c.body))
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write(bytes.Repeat([]byte("e"), c.body))
			}), relServerOpts{})
			base := relH1Base()
			out := relDo(t, base, relMethods[0].request(t, srv.URL))
			if out.status != http.StatusOK || out.attempts != 3 {
				t.Fatalf("status %d after %d tries, want 200 after 3", out.status, out.attempts)
			}
			if got := srv.conns.count(); got != c.wantConns {
				t.Errorf("server saw %d connections, want %d", got, c.wantConns)
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
	}
}

// TestReliabilityHugeBodyNotRead retries a response whose body is 100 MiB:
// the Transport reads at most 64 KiB of it, whether the server sends it on
// a real connection or an in-memory base hands it over.
func TestReliabilityHugeBodyNotRead(t *testing.T) {
	const huge = 100 << 20
	for _, chunked := range []bool{false, true} {
		name := "content-length"
		if chunked {
			name = "chunked"
		}
		t.Run("loopback/"+name, func(t *testing.T) {
			relNoLeaks(t)
			var (
				n       atomic.Int64
				written atomic.Int64
				done    = make(chan struct{})
			)
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) > 1 {
					w.Write([]byte("ok"))
					return
				}
				defer close(done)
				if !chunked {
					w.Header().Set("Content-Length", fmt.Sprint(huge))
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				chunk := bytes.Repeat([]byte("h"), 32<<10)
				for written.Load() < huge {
					k, err := w.Write(chunk)
					written.Add(int64(k))
					if err != nil {
						return
					}
				}
			}), relServerOpts{})
			base := relH1Base()
			start := time.Now()
			out := relDo(t, base, relMethods[0].request(t, srv.URL))
			if out.status != http.StatusOK || out.attempts != 2 {
				t.Fatalf("status %d after %d tries, want 200 after 2", out.status, out.attempts)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the server is still writing the huge body")
			}
			t.Logf("server wrote %d of %d bytes before the client hung up; %v", written.Load(), huge, time.Since(start))
			if written.Load() >= huge/4 {
				t.Errorf("server wrote %d bytes: the retried body was read", written.Load())
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
		t.Run("in-memory/"+name, func(t *testing.T) {
			var bodies []*relBody
			base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
				b := relNewBody(huge)
				bodies = append(bodies, b)
				length := int64(huge)
				if chunked {
					length = -1
				}
				return relResponse(r, http.StatusServiceUnavailable, nil, b, length), nil
			})
			tr := New(WithBase(base), WithBudget(nil), WithBackoff(time.Microsecond, time.Microsecond))
			resp, err := tr.RoundTrip(relGet(t, context.Background(), "http://mem.test/"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(bodies) != 3 {
				t.Fatalf("%d tries, want 3", len(bodies))
			}
			for i, b := range bodies[:2] {
				if !b.closed.Load() {
					t.Errorf("retried body %d was not closed", i)
				}
				// At most 64 KiB, and one byte more to see the end of a body
				// of exactly 64 KiB.
				if got := b.read.Load(); got > drainLimit+1 {
					t.Errorf("retried body %d: read %d bytes, more than %d", i, got, drainLimit+1)
				}
				t.Logf("retried body %d: %d bytes read", i, b.read.Load())
			}
			if got := bodies[2].read.Load(); got != 0 {
				t.Errorf("the final body was read (%d bytes) before the caller got it", got)
			}
		})
	}
}

// TestReliabilitySlowRetriedBody: a server answers 503 and then trickles
// the body of that answer, a few bytes at a time. The Transport drains a
// retried response to reuse its connection, but a drain is no reason to
// wait on the server: the retry must not be held for as long as the server
// takes to finish a body nobody will read.
func TestReliabilitySlowRetriedBody(t *testing.T) {
	relNoLeaks(t)
	const trickle = 2 * time.Second
	var n atomic.Int64
	srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusServiceUnavailable)
		rc := http.NewResponseController(w)
		for i := range 20 {
			if _, err := w.Write(bytes.Repeat([]byte("s"), 50)); err != nil || rc.Flush() != nil {
				return
			}
			if i < 19 {
				select {
				case <-time.After(trickle / 20):
				case <-r.Context().Done():
					return
				}
			}
		}
	}), relServerOpts{})
	base := relH1Base()
	start := time.Now()
	out := relDo(t, base, relMethods[0].request(t, srv.URL))
	elapsed := time.Since(start)
	t.Logf("status %d after %d tries in %v (the server takes %v to finish the 503's body)", out.status, out.attempts, elapsed, trickle)
	if out.status != http.StatusOK || out.attempts != 2 {
		t.Fatalf("status %d after %d tries, want 200 after 2", out.status, out.attempts)
	}
	if elapsed > trickle/2 {
		t.Errorf("the retry waited %v on the body of the answer it retried", elapsed)
	}
	relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
}

// ---------------------------------------------------------------------------
// Hostile headers: a server sends a megabyte of Retry-After or RateLimit.

func TestReliabilityHugeHeader(t *testing.T) {
	const mib = 1 << 20
	const date = "Sun, 06 Nov 1994 08:49:37 GMT"
	cases := []struct {
		name    string
		status  int
		headers map[string]string
		tries   int    // tries the server sees
		reason  Reason // why the last failure was not retried
	}{
		{"Retry-After digits", 503, map[string]string{"Retry-After": strings.Repeat("9", mib)}, 3, ReasonAttempts},
		{"Retry-After spaces then 0", 429, map[string]string{"Retry-After": strings.Repeat(" ", mib) + "0"}, 3, ReasonAttempts},
		{"Retry-After date-like", 503, map[string]string{"Retry-After": date + strings.Repeat("x", mib)}, 3, ReasonAttempts},
		{"Date huge", 503, map[string]string{"Retry-After": date, "Date": date + strings.Repeat("x", mib)}, 3, ReasonAttempts},
		// A megabyte of well-formed spent policies is no RateLimit field a
		// server really sends: it is refused unread, like garbage, and the
		// answer retried on backoff. Ten of them are read, and the reset of
		// 1 s, beyond the max, parks the host.
		{"RateLimit spent policies", 429, map[string]string{"Ratelimit": strings.Repeat(`"p";r=0;t=1,`, mib/12)}, 3, ReasonAttempts},
		{"RateLimit ten spent policies", 429, map[string]string{"Ratelimit": strings.Repeat(`"p";r=0;t=1,`, 10)}, 1, ReasonServerWait},
		{"RateLimit garbage", 503, map[string]string{"Ratelimit": strings.Repeat("A=;", mib/3)}, 3, ReasonAttempts},
		{"X-RateLimit-Reset digits", 503, map[string]string{"X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": strings.Repeat("1", mib)}, 3, ReasonAttempts},
		{"X-RateLimit with a huge Date", 503, map[string]string{"X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "1",
			"Date": date + strings.Repeat("x", mib)}, 1, ReasonServerWait},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			relNoLeaks(t)
			var n atomic.Int64
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				for k, v := range c.headers {
					w.Header()[k] = []string{v}
				}
				w.WriteHeader(c.status)
			}), relServerOpts{})
			base := relH1Base()
			start := time.Now()
			// The answers are about parsing; learning would pace the host
			// that refuses every try.
			out := relDo(t, base, relMethods[0].request(t, srv.URL), WithLearning(false))
			elapsed := time.Since(start)
			var delays []time.Duration
			for _, ev := range out.events {
				delays = append(delays, ev.Delay)
			}
			t.Logf("%d tries in %v, delays %v, refused: %s", n.Load(), elapsed, delays, out.reasons)
			if out.status != c.status || int(n.Load()) != c.tries {
				t.Errorf("status %d after %d tries, want %d after %d", out.status, n.Load(), c.status, c.tries)
			}
			if out.reasons != string(c.reason)+";" {
				t.Errorf("refused: %q, want %q", out.reasons, c.reason)
			}
			for _, d := range delays {
				if d < 0 || d > 50*time.Millisecond {
					t.Errorf("delay %v outside [0, 50ms]", d)
				}
			}
			if elapsed > 5*time.Second {
				t.Errorf("took %v", elapsed)
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
	}

	// What the Transport itself allocates for such a response, with the
	// response made in advance by an in-memory base.
	t.Run("allocation", func(t *testing.T) {
		for _, c := range cases {
			h := make(http.Header)
			for k, v := range c.headers {
				h[k] = []string{v}
			}
			base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
				return relResponse(r, c.status, h, nil, 0), nil
			})
			tr := New(WithBase(base), WithBudget(nil), WithMaxAttempts(3),
				WithBackoff(time.Nanosecond, time.Nanosecond), WithRetryAfterLimits(time.Nanosecond, time.Nanosecond))
			req := relGet(t, context.Background(), "http://mem.test/")
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			alloc := (after.TotalAlloc - before.TotalAlloc) / uint64(c.tries)
			t.Logf("%s: %d bytes in %d allocations a try, %v for %d tries", c.name, alloc, (after.Mallocs-before.Mallocs)/uint64(c.tries), elapsed, c.tries)
			if alloc > 256<<10 {
				t.Errorf("%s: the Transport allocated %d bytes a try for a 1 MiB header", c.name, alloc)
			}
		}
	})
}
