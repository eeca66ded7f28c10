package retryhttp

// Slow tails (issue 17): a host that answers in 10 ms but holds one request
// in twenty for 10 s, and what the attempt timeout and hedging make of it.
// Real net/http servers and clients over the in-memory network of a
// testing/synctest bubble.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// tailHost answers in 10 ms, but holds every 20th request for 10 s.
type tailHost struct {
	n        atomic.Int64
	requests atomic.Int64
}

func (h *tailHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	io.Copy(io.Discard, r.Body)
	d := 10 * time.Millisecond
	if h.n.Add(1)%20 == 0 {
		d = 10 * time.Second
	}
	select {
	case <-time.After(d):
		w.Write([]byte("ok"))
	case <-r.Context().Done(): // the client gave up on it
	}
}

// tailRun is what 30 workers saw fetching 600 pages.
type tailRun struct {
	served   int
	requests int64
	took     time.Duration
	p50, p99 time.Duration
	slowest  time.Duration
	// held is how many calls took more than a second, unhedged is how
	// many hedges OnGiveUp said could not go for want of attempts.
	held, unhedged int
}

// runTail fetches 600 pages with 30 workers through a Transport made with
// opts, each caller behind an http.Client.Timeout of 30 s.
func runTail(t *testing.T, opts ...Option) tailRun {
	var run tailRun
	synctest.Test(t, func(t *testing.T) {
		host := &tailHost{}
		net := newPipeNet(host)
		defer net.close()
		var unhedged atomic.Int64
		noHedge := WithOnGiveUp(func(ev RetryEvent) {
			if ev.Hedge && ev.Reason == ReasonAttempts {
				unhedged.Add(1)
			}
		})
		client := &http.Client{Transport: New(append([]Option{WithBase(net.tr), noHedge}, opts...)...), Timeout: 30 * time.Second}
		var (
			mu        sync.Mutex
			latencies []time.Duration
			next      atomic.Int64
			wg        sync.WaitGroup
		)
		start := time.Now()
		for range 30 {
			wg.Go(func() {
				for page := next.Add(1); page <= 600; page = next.Add(1) {
					t0 := time.Now()
					resp, err := client.Get(fmt.Sprintf("http://tail.test/page/%d", page))
					if err != nil {
						continue
					}
					body := readAll(resp)
					mu.Lock()
					if resp.StatusCode == 200 && body == "ok" {
						run.served++
						latencies = append(latencies, time.Since(t0))
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		run.took, run.requests, run.unhedged = time.Since(start), host.requests.Load(), int(unhedged.Load())
		for _, d := range latencies {
			if d > time.Second {
				run.held++
			}
		}
		slices.Sort(latencies)
		if n := len(latencies); n > 0 {
			run.p50, run.p99, run.slowest = latencies[n/2], latencies[n*99/100], latencies[n-1]
		}
	})
	return run
}

// TestSlowTails: the hung-tail host through the defaults (every request
// held 10 s is waited out), with an attempt timeout of 200 ms (every page,
// none slower than 500 ms), with hedging after 100 ms (p99 at most 150 ms,
// at most 10 % more requests) and with a learned hedge delay (p99 at most
// 200 ms, at most 15 % more requests).
func TestSlowTails(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []Option
		check func(tailRun) string
	}{
		{"defaults", nil, func(r tailRun) string {
			if r.served != 600 || r.p99 < 10*time.Second {
				return "want every page, and the held ones waited out"
			}
			return ""
		}},
		{"WithAttemptTimeout(200ms)", []Option{WithAttemptTimeout(200 * time.Millisecond)}, func(r tailRun) string {
			// A page whose three tries all land on a twentieth request is
			// lost: one in 400 of the 30 held first tries, so one page in
			// about 13 runs.
			if r.served < 599 || r.slowest > 500*time.Millisecond {
				return "want every page (but for a page whose every try is held), none slower than 500 ms"
			}
			return ""
		}},
		{"WithHedging(100ms)", []Option{WithHedging(100 * time.Millisecond)}, func(r tailRun) string {
			if r.served != 600 || r.p99 > 150*time.Millisecond || r.requests > 660 {
				return "want every page, p99 at most 150 ms, at most 660 requests"
			}
			if r.held > r.unhedged {
				return "want every call over a second to have met held requests on all its attempts, and OnGiveUp to say so"
			}
			return ""
		}},
		{"WithHedging(0)", []Option{WithHedging(0)}, func(r tailRun) string {
			if r.served != 600 || r.p99 > 200*time.Millisecond || r.requests > 690 {
				return "want every page, p99 at most 200 ms, at most 690 requests"
			}
			if r.held > r.unhedged {
				return "want every call over a second to have met held requests on all its attempts, and OnGiveUp to say so"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runTail(t, tc.opts...)
			t.Logf("%d of 600 pages, %d requests, in %v; p50 %v, p99 %v, slowest %v; %d calls over a second, %d hedges out of attempts", r.served, r.requests,
				r.took.Round(time.Millisecond), r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.slowest.Round(time.Millisecond), r.held, r.unhedged)
			if msg := tc.check(r); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// TestAttemptTimeout: a timed-out attempt is abandoned, and tried again
// when the request is safe to repeat; an unkeyed POST is sent once, and the
// caller's error says which attempt timed out and matches
// context.DeadlineExceeded. The body of an answer whose headers came in
// time is never cut, however slow. A policy sets or lifts the timeout for
// one request.
func TestAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits, done atomic.Int64
		net := newPipeNet(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			n := hits.Add(1)
			if r.URL.Path == "/slowbody" {
				w.Header().Set("Content-Length", "4")
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				time.Sleep(time.Second) // the body, long after the headers
				io.WriteString(w, "body")
				return
			}
			if n%2 == 1 { // every other attempt hangs
				select {
				case <-time.After(time.Minute):
				case <-r.Context().Done():
					done.Add(1)
				}
				return
			}
			io.WriteString(w, "ok")
		}))
		defer net.close()
		var events []RetryEvent
		tr := New(WithBase(net.tr), WithAttemptTimeout(200*time.Millisecond), WithBudget(nil),
			onEvents(func(ev RetryEvent) { events = append(events, ev) }))

		start := time.Now()
		if code, body := get(t, tr, "http://x.test/get"); code != 200 || body != "ok" {
			t.Fatalf("GET: %d %q", code, body)
		}
		if took := time.Since(start); took != 200*time.Millisecond || len(events) != 1 || !timedOut(events[0].Err) || events[0].Delay != 0 {
			t.Errorf("GET took %v, events %+v; want one timeout at 200ms and its retry at once", took, events)
		}

		events = nil
		_, err := send(tr, http.MethodPost, "http://x.test/post", "order", nil)
		var te *AttemptTimeoutError
		if !errors.As(err, &te) || te.Attempt != 1 || te.After != 200*time.Millisecond || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("POST: %v; want attempt 1's timeout after 200ms, matching DeadlineExceeded", err)
		}
		if len(events) != 1 || events[0].Reason != ReasonNotIdempotent {
			t.Errorf("POST events %+v; want one refusal, not idempotent", events)
		}
		if !strings.Contains(err.Error(), "attempt 1 timed out after 200ms") {
			t.Errorf("POST error %q does not say which attempt timed out", err)
		}

		start = time.Now()
		if code, body := get(t, tr, "http://x.test/slowbody"); code != 200 || body != "body" {
			t.Errorf("slow body: %d %q after %v; want it whole", code, body, time.Since(start))
		}

		ctx := ContextWithPolicy(context.Background(), PolicyAttemptTimeout(-1))
		hits.Store(0) // the next attempt hangs a minute: no timeout for it
		start = time.Now()
		resp, err := sendCtx(ctx, tr, http.MethodGet, "http://x.test/get", "", nil)
		if err != nil || time.Since(start) < time.Minute {
			t.Errorf("with the timeout lifted: %v after %v, want the answer after a minute", err, time.Since(start))
		} else {
			resp.Body.Close()
		}
		if done.Load() < 2 {
			t.Errorf("%d abandoned attempts saw their context end, want the base to let go of them", done.Load())
		}
	})
}
