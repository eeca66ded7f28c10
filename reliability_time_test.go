package retryhttp

// Reliability in time: a request cancelled in any kind of wait (backoff,
// pace, parked host) returns at once, nothing waits past the request's
// deadline, and a cancelled pace wait gives its slot back. Issue 4.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ---------------------------------------------------------------------------
// Cancel and deadline.

// relWaitKind is a wait a request can be in when its context ends.
type relWaitKind struct {
	name string
	// With these options, against a server answering status (with
	// Retry-After: header when set), the next request waits in this kind
	// of wait; prime says a first request must put the Transport in that
	// state (take the only token, park the host).
	opts   []Option
	status int    // what the base answers
	header string // Retry-After of the base's answers
	prime  bool   // send one request first (to take the token, park the host)
}

var relWaitKinds = []relWaitKind{
	{
		name:   "backoff",
		opts:   []Option{WithBackoff(10*time.Second, 10*time.Second), fixedRand(0.5)},
		status: http.StatusServiceUnavailable,
	},
	{
		name:   "pace",
		opts:   []Option{WithPace(0.1, 1)}, // one every 10 s
		status: http.StatusOK,
		prime:  true,
	},
	{
		name:   "parked host",
		opts:   []Option{WithMaxAttempts(1)},
		status: http.StatusServiceUnavailable,
		header: "30",
		prime:  true,
	},
}

// TestReliabilityCancelDuringWait cancels a request while it waits, in
// each kind of wait, inside a synctest bubble: the request returns at the
// very instant of the cancel (time.Since is exactly the time to the
// cancel), with an error that errors.Is context.Canceled, and the response
// it was going to retry is closed.
func TestReliabilityCancelDuringWait(t *testing.T) {
	for _, k := range relWaitKinds {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu     sync.Mutex
					bodies []*relBody
					sent   int
				)
				base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					defer mu.Unlock()
					sent++
					b := relNewBody(10)
					bodies = append(bodies, b)
					h := make(http.Header)
					if k.header != "" {
						h.Set("Retry-After", k.header)
					}
					return relResponse(r, k.status, h, b, 10), nil
				})
				tr := New(append([]Option{WithBase(base), WithBudget(nil)}, k.opts...)...)
				if k.prime {
					resp, err := tr.RoundTrip(relGet(t, context.Background(), "http://wait.test/"))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				ctx, cancel := context.WithCancel(context.Background())
				sentBefore := sent
				var closedAtCancel bool
				go func() {
					time.Sleep(time.Second)
					mu.Lock()
					closedAtCancel = len(bodies) > 0 && bodies[len(bodies)-1].closed.Load()
					mu.Unlock()
					cancel()
				}()
				start := time.Now()
				resp, err := tr.RoundTrip(relGet(t, ctx, "http://wait.test/"))
				elapsed := time.Since(start)
				if resp != nil {
					resp.Body.Close()
					t.Fatalf("got a response (%d), want the cancel's error", resp.StatusCode)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("error %v does not wrap context.Canceled", err)
				}
				if elapsed != time.Second {
					t.Errorf("returned %v after the start, want exactly 1s (the cancel)", elapsed)
				}
				if k.name == "backoff" {
					if sent-sentBefore != 1 || !closedAtCancel {
						t.Errorf("%d tries, pending response closed before the cancel: %v; want 1 and true", sent-sentBefore, closedAtCancel)
					}
				} else if sent != sentBefore {
					t.Errorf("the cancelled request reached the base")
				}
			})
		})
	}
}

// TestReliabilityCancelLatency measures, on the real clock against a
// loopback server, how long a request takes to return after its context
// is cancelled in each kind of wait.
func TestReliabilityCancelLatency(t *testing.T) {
	const reps = 10
	for _, k := range relWaitKinds {
		t.Run(k.name, func(t *testing.T) {
			relNoLeaks(t)
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if k.header != "" {
					w.Header().Set("Retry-After", k.header)
				}
				w.WriteHeader(k.status)
			}), relServerOpts{})
			base := relH1Base()
			t.Cleanup(base.CloseIdleConnections)
			var lat []time.Duration
			for range reps {
				tr := New(append([]Option{WithBase(base), WithBudget(nil)}, k.opts...)...)
				if k.prime {
					resp, err := tr.RoundTrip(relGet(t, context.Background(), srv.URL))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				ctx, cancel := context.WithCancel(context.Background())
				var cancelledAt atomic.Int64
				go func() {
					time.Sleep(30 * time.Millisecond)
					cancelledAt.Store(time.Now().UnixNano())
					cancel()
				}()
				resp, err := tr.RoundTrip(relGet(t, ctx, srv.URL))
				returned := time.Now()
				if resp != nil {
					resp.Body.Close()
				}
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("error %v does not wrap context.Canceled", err)
				}
				lat = append(lat, returned.Sub(time.Unix(0, cancelledAt.Load())))
			}
			slices.Sort(lat)
			t.Logf("%s: return after cancel over %d runs: min %v, median %v, max %v", k.name, reps, lat[0], lat[reps/2], lat[reps-1])
			if lat[reps-1] > 100*time.Millisecond {
				t.Errorf("a cancel took %v to return", lat[reps-1])
			}
		})
	}
}

// TestReliabilityDeadline: nothing waits past the request's deadline. A
// wait that would end after it is not started; the last answer is
// returned at once (in a synctest bubble: after no time at all). A wait
// that fits is made, to the nanosecond.
func TestReliabilityDeadline(t *testing.T) {
	cases := []struct {
		name    string
		opts    []Option
		answers []int  // statuses the base gives, the last repeated
		header  string // Retry-After on 503s
		prime   bool
		// the outcome
		wantStatus  int
		wantErr     error
		wantElapsed time.Duration
		wantTries   int
	}{
		{
			name: "Retry-After 5s, deadline 2s", answers: []int{503}, header: "5",
			wantStatus: 503, wantElapsed: 0, wantTries: 1,
		},
		{
			name:    "backoff 5s, deadline 2s",
			opts:    []Option{WithBackoff(10*time.Second, 10*time.Second), fixedRand(0.5)},
			answers: []int{503}, wantStatus: 503, wantElapsed: 0, wantTries: 1,
		},
		{
			name: "pace slot in 10s, deadline 2s", opts: []Option{WithPace(0.1, 1)}, answers: []int{200}, prime: true,
			wantErr: context.DeadlineExceeded, wantElapsed: 0, wantTries: 0,
		},
		{
			name: "host parked 30s, deadline 2s", opts: []Option{WithMaxAttempts(1)}, answers: []int{503}, header: "30", prime: true,
			wantErr: ErrHostPaused, wantElapsed: 0, wantTries: 0,
		},
		{
			name: "Retry-After 1s fits a 2s deadline", answers: []int{503, 200}, header: "1",
			wantStatus: 200, wantElapsed: time.Second, wantTries: 2,
		},
		{
			name:    "backoff 1s fits a 2s deadline",
			opts:    []Option{WithBackoff(2*time.Second, 2*time.Second), fixedRand(0.5)},
			answers: []int{503, 200}, wantStatus: 200, wantElapsed: time.Second, wantTries: 2,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var tries atomic.Int64
				base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
					n := int(tries.Add(1)) - 1
					status := c.answers[min(n, len(c.answers)-1)]
					h := make(http.Header)
					if status == 503 && c.header != "" {
						h.Set("Retry-After", c.header)
					}
					return relResponse(r, status, h, nil, 0), nil
				})
				tr := New(append([]Option{WithBase(base), WithBudget(nil)}, c.opts...)...)
				if c.prime {
					resp, err := tr.RoundTrip(relGet(t, context.Background(), "http://deadline.test/"))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					tries.Store(0)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				start := time.Now()
				resp, err := tr.RoundTrip(relGet(t, ctx, "http://deadline.test/"))
				elapsed := time.Since(start)
				status := 0
				if resp != nil {
					status = resp.StatusCode
					resp.Body.Close()
				}
				got := fmt.Sprintf("status %d, err %v, after %v, %d tries", status, err, elapsed, tries.Load())
				if status != c.wantStatus || elapsed != c.wantElapsed || int(tries.Load()) != c.wantTries ||
					(c.wantErr == nil) != (err == nil) || (c.wantErr != nil && !errors.Is(err, c.wantErr)) {
					t.Errorf("got %s; want status %d, err %v, after %v, %d tries", got, c.wantStatus, c.wantErr, c.wantElapsed, c.wantTries)
				}
			})
		})
	}
}

// TestReliabilityDeadlineLoopback is the first case of
// TestReliabilityDeadline on the real clock: a server answers 503 with
// Retry-After: 5 to a request with a 2 s deadline, which gets the 503 at
// once, not after 2 s.
func TestReliabilityDeadlineLoopback(t *testing.T) {
	relNoLeaks(t)
	var n atomic.Int64
	srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
	}), relServerOpts{})
	base := relH1Base()
	t.Cleanup(base.CloseIdleConnections)
	tr := New(WithBase(base))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(relGet(t, ctx, srv.URL))
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("503 with Retry-After: 5 under a 2 s deadline returned after %v", elapsed)
	if resp.StatusCode != http.StatusServiceUnavailable || n.Load() != 1 {
		t.Errorf("status %d after %d tries, want 503 after 1", resp.StatusCode, n.Load())
	}
	if elapsed > 500*time.Millisecond {
		t.Errorf("took %v: the Transport waited toward a retry the deadline did not allow", elapsed)
	}
}

// TestReliabilityCancelledPaceWaitFreesSlot: a request cancelled while it
// waits for its pace slot never makes its attempt, so the slot must go back
// to the host's bucket (as rate.Limiter.Wait does), not push every later
// request one slot further out. With one slot per 10 s taken at 0 s, a
// request cancelled at 1 s and another sent at 1 s: the second should be
// sent at 10 s, not 20 s.
func TestReliabilityCancelledPaceWaitFreesSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sentAt []time.Duration
		start := time.Now()
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			sentAt = append(sentAt, time.Since(start))
			return relResponse(r, http.StatusOK, nil, nil, 0), nil
		})
		tr := New(WithBase(base), WithPace(0.1, 1))
		do := func(ctx context.Context) error {
			resp, err := tr.RoundTrip(relGet(t, ctx, "http://paced.test/"))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := do(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- do(ctx) }()
		time.Sleep(time.Second)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled request: %v", err)
		}
		if err := do(context.Background()); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]time.Duration{0, 10 * time.Second}, sentAt); diff != "" {
			t.Errorf("attempts sent at (-want +got):\n%s", diff)
		}
	})
}
