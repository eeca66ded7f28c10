package retryhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// bodyCloses is a caller's body that counts its Close calls.
type bodyCloses struct {
	io.Reader
	closes atomic.Int32
}

func (c *bodyCloses) Close() error { c.closes.Add(1); return nil }

// seekBodyCloses is a caller's body that can seek, and counts its Close calls.
type seekBodyCloses struct {
	*bytes.Reader
	closes atomic.Int32
}

func (c *seekBodyCloses) Close() error { c.closes.Add(1); return nil }

// R4: a body without GetBody is sent again from what the base read, up to
// the replay limit, or by seeking; a longer one is sent once and the event
// says why; the caller's body is closed once, whatever happens.
func TestReplayBodyWithoutGetBody(t *testing.T) {
	small := strings.Repeat("0123456789", 6554) // 64 KiB and a bit
	large := strings.Repeat("abcdefghij", 30000)
	cases := []struct {
		name     string
		payload  string
		seek     bool
		skip     int   // bytes of a seeker read before the request
		length   int64 // ContentLength; -1 for unknown
		limit    int64
		attempts int
		reason   Reason
	}{
		{name: "reader, length known", payload: small, length: int64(len(small)), attempts: 2},
		{name: "reader, length unknown", payload: small, length: -1, attempts: 2},
		{name: "reader at the limit", payload: small, length: -1, limit: int64(len(small)), attempts: 2},
		{name: "reader over the limit, length known", payload: small, length: int64(len(small)), limit: 1000, attempts: 1, reason: ReasonNoRewind},
		{name: "reader over the limit, length unknown", payload: small, length: -1, limit: int64(len(small)) - 1, attempts: 1, reason: ReasonNoRewind},
		{name: "copying off", payload: small, length: -1, limit: -1, attempts: 1, reason: ReasonNoRewind},
		{name: "seeker beyond the limit", payload: large, seek: true, length: int64(len(large)), limit: 1000, attempts: 2},
		{name: "seeker read in part before", payload: large, seek: true, skip: 10, length: int64(len(large) - 10), attempts: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/": {{status: 500, body: "fail"}, {status: 200, body: "ok"}}})
				net := newPipeNet(host)
				defer net.close()
				var ev events
				tr := New(WithBase(net.tr), WithReplayLimit(c.limit), onEvents(ev.add))
				var body io.ReadCloser
				var closes *atomic.Int32
				if c.seek {
					sc := &seekBodyCloses{Reader: bytes.NewReader([]byte(c.payload))}
					sc.Seek(int64(c.skip), io.SeekStart)
					body, closes = sc, &sc.closes
				} else {
					cc := &bodyCloses{Reader: strings.NewReader(c.payload)}
					body, closes = cc, &cc.closes
				}
				req, _ := http.NewRequest(http.MethodPut, "http://x.test/", body)
				req.ContentLength = c.length
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				got := readAll(resp)
				want := c.payload[c.skip:]
				hits := host.all()
				if len(hits) != c.attempts {
					t.Fatalf("%d attempts, want %d", len(hits), c.attempts)
				}
				for i, h := range hits {
					if h.body != want {
						t.Errorf("attempt %d sent %d bytes, not the caller's %d", i+1, len(h.body), len(want))
					}
				}
				if c.attempts == 1 {
					if got != "fail" {
						t.Errorf("body %q, want the failed answer's", got)
					}
					evs := ev.list()
					if len(evs) != 1 || evs[0].Reason != c.reason {
						t.Errorf("events %+v, want one with reason %q", evs, c.reason)
					}
				}
				synctest.Wait() // net/http closes a request body in its write loop
				if n := closes.Load(); n != 1 {
					t.Errorf("the caller's body was closed %d times, want 1", n)
				}
			})
		})
	}
}

// roundTripFunc is a base made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func canned(status int, body string) *http.Response {
	return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body))}
}

// The RoundTripper contract lets a base read and close the body after
// RoundTrip returned, as net/http's write loop does when a server answers
// early: the replay waits for the close, and sends the caller's bytes whole.
func TestReplayWaitsForTheBase(t *testing.T) {
	payload := strings.Repeat("x", 50_000)
	synctest.Test(t, func(t *testing.T) {
		var (
			mu    sync.Mutex
			reads []string
			at    []time.Duration
			wg    sync.WaitGroup
		)
		start := time.Now()
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			n := len(at)
			at = append(at, time.Since(start))
			mu.Unlock()
			if n == 0 {
				// Answer first, read later: the body is still the base's.
				wg.Go(func() {
					time.Sleep(300 * time.Millisecond)
					b, _ := io.ReadAll(r.Body)
					r.Body.Close()
					mu.Lock()
					reads = append(reads, string(b))
					mu.Unlock()
				})
				return canned(503, "busy"), nil
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			mu.Lock()
			reads = append(reads, string(b))
			mu.Unlock()
			return canned(200, "ok"), nil
		})
		tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
		body := &bodyCloses{Reader: strings.NewReader(payload)}
		req, _ := http.NewRequest(http.MethodPut, "http://x.test/", body)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wg.Wait()
		if len(reads) != 2 || reads[0] != payload || reads[1] != payload {
			t.Fatalf("attempts read %d bodies, want the caller's twice", len(reads))
		}
		if at[1] < 300*time.Millisecond {
			t.Errorf("the retry went at %v, before the base closed the first body at 300ms", at[1])
		}
		if n := body.closes.Load(); n != 1 {
			t.Errorf("the caller's body was closed %d times, want 1", n)
		}
	})
}

// A base that never closes the body breaks the contract: the retry waits a
// bounded time for it, then hands back the answer it has, whole.
func TestReplayBaseKeepsTheBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls++
			return canned(503, "busy"), nil
		})
		var ev events
		tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), onEvents(ev.add))
		req, _ := http.NewRequest(http.MethodPut, "http://x.test/", &bodyCloses{Reader: strings.NewReader("data")})
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(resp); got != "busy" || calls != 1 {
			t.Errorf("body %q after %d calls, want the 503's after 1", got, calls)
		}
		if d := time.Since(start); d > replayCloseWait+10*time.Millisecond {
			t.Errorf("waited %v for the base, want at most %v", d, replayCloseWait)
		}
		if evs := ev.list(); len(evs) != 1 || evs[0].Reason != ReasonNoRewind {
			t.Errorf("events %+v, want one refusal with %q", evs, ReasonNoRewind)
		}
	})
}

// A caller's body that fails is not replayed: what follows the failure is
// unknown.
func TestReplayBodyFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls++
			io.ReadAll(r.Body)
			r.Body.Close()
			return canned(503, "busy"), nil
		})
		tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond))
		broken := io.MultiReader(strings.NewReader("half"), iotestErrReader{})
		req, _ := http.NewRequest(http.MethodPut, "http://x.test/", &bodyCloses{Reader: broken})
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if calls != 1 {
			t.Errorf("%d attempts, want 1", calls)
		}
	})
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

// ResendCount tells what runs below the Transport which try it sees.
func TestResendCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var counts []int
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			counts = append(counts, ResendCount(r.Context()))
			if r.Body != nil {
				io.ReadAll(r.Body)
				r.Body.Close()
			}
			return canned(503, ""), nil
		})
		tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
		for _, body := range []io.Reader{nil, strings.NewReader("x"), &bodyCloses{Reader: strings.NewReader("y")}} {
			counts = nil
			req, _ := http.NewRequest(http.MethodPut, "http://x.test/", body)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if diff := cmp.Diff([]int{0, 1, 2}, counts); diff != "" {
				t.Errorf("resend counts (-want +got):\n%s", diff)
			}
		}
		if n := ResendCount(context.Background()); n != 0 {
			t.Errorf("ResendCount of a plain context = %d, want 0", n)
		}
	})
}

// Over a real net/http base and loopback: a server that answers before
// reading the body, and drops the connection, leaves net/http's write loop
// with the body after RoundTrip returned. The retry still sends the
// caller's bytes whole.
func TestReplayAfterEarlyAnswer(t *testing.T) {
	payload := strings.Repeat("0123456789abcdef", 12<<10) // 192 KiB
	var (
		mu     sync.Mutex
		bodies []string
	)
	srv := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(bodies)
		mu.Unlock()
		if n == 0 {
			// Answer first and drop the connection: the client is still
			// writing the body.
			mu.Lock()
			bodies = append(bodies, "")
			mu.Unlock()
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithLearning(false))
	defer tr.CloseIdleConnections()
	body := &bodyCloses{Reader: strings.NewReader(payload)}
	req, _ := http.NewRequest(http.MethodPut, srv.URL, body)
	req.ContentLength = int64(len(payload))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200 after a retry", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || bodies[1] != payload {
		t.Fatalf("%d attempts; the retry sent %d bytes, want the caller's %d", len(bodies), len(bodies[len(bodies)-1]), len(payload))
	}
	deadline := time.Now().Add(2 * time.Second)
	for body.closes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := body.closes.Load(); n != 1 {
		t.Errorf("the caller's body was closed %d times, want 1", n)
	}
}

// TestParkingDuringBodyWaitHoldsRetry: a retry that waits for the base to
// let go of the previous attempt's body (500 ms) meets a parking another
// request's answer set meanwhile (at 200 ms, for 10 s): admission comes
// after that wait, so the retry goes when the parking ends, not at 500 ms.
// When the parking is beyond the max, the retry is refused, the 503 comes
// back whole, and the body made ready for it is closed with the caller's.
func TestParkingDuringBodyWaitHoldsRetry(t *testing.T) {
	for _, parkFor := range []string{"10", "120"} {
		t.Run("Retry-After "+parkFor, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu sync.Mutex
					at []time.Duration
					wg sync.WaitGroup
				)
				start := time.Now()
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					at = append(at, time.Since(start))
					n := len(at)
					mu.Unlock()
					switch {
					case r.URL.Path == "/other":
						resp := canned(503, "")
						resp.Header.Set("Retry-After", parkFor)
						return resp, nil
					case n == 1:
						wg.Go(func() { // net/http's write loop, still sending
							time.Sleep(500 * time.Millisecond)
							io.Copy(io.Discard, r.Body)
							r.Body.Close()
						})
						return canned(503, "busy"), nil
					}
					io.Copy(io.Discard, r.Body)
					r.Body.Close()
					return canned(200, "ok"), nil
				})
				var reasons []Reason // of the PUT
				tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil),
					WithLearning(false), WithOnGiveUp(func(ev RetryEvent) {
						if ev.Request.Method == http.MethodPut {
							reasons = append(reasons, ev.Reason)
						}
					}))
				wg.Go(func() {
					time.Sleep(200 * time.Millisecond)
					resp, err := send(tr, http.MethodGet, "http://x.test/other", "", nil)
					if err == nil {
						resp.Body.Close()
					}
				})
				body := &bodyCloses{Reader: strings.NewReader("payload")}
				req, _ := http.NewRequest(http.MethodPut, "http://x.test/put", body)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				got := readAll(resp)
				wg.Wait()
				mu.Lock()
				defer mu.Unlock()
				if parkFor == "10" {
					if resp.StatusCode != 200 || len(at) < 3 || at[2] < 10200*time.Millisecond {
						t.Errorf("status %d, attempts at %v: the retry must wait out the parking until 10.2s", resp.StatusCode, at)
					}
				} else {
					if resp.StatusCode != 503 || got != "busy" || len(at) != 2 {
						t.Errorf("status %d %q, attempts at %v: want the first 503 back whole, no retry", resp.StatusCode, got, at)
					}
					if len(reasons) == 0 || reasons[len(reasons)-1] != ReasonHostPaused {
						t.Errorf("reasons %v, want the last to be %q", reasons, ReasonHostPaused)
					}
				}
				if n := body.closes.Load(); n != 1 {
					t.Errorf("the caller's body was closed %d times, want 1", n)
				}
			})
		})
	}
}

// TestFirstTryResendCountIsZero: an auth wrapper below a Transport fetches
// a token with the request's context, through a Transport of its own. On
// the outer request's retry, the context carries a resend count of 1; the
// token request's first try still reads 0.
func TestFirstTryResendCountIsZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tokenCounts []int
		tokens := New(WithBase(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			tokenCounts = append(tokenCounts, ResendCount(r.Context()))
			return canned(200, "token"), nil
		})))
		calls := 0
		api := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls++
			if calls == 1 {
				return canned(503, ""), nil
			}
			return canned(200, "ok"), nil
		})
		auth := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			treq, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://auth.test/token", nil)
			resp, err := tokens.RoundTrip(treq)
			if err != nil {
				return nil, err
			}
			resp.Body.Close()
			return api.RoundTrip(r)
		})
		tr := New(WithBase(auth), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
		status, _ := get(t, tr, "http://api.test/x")
		if status != 200 {
			t.Fatalf("status %d", status)
		}
		if diff := cmp.Diff([]int{0, 0}, tokenCounts); diff != "" {
			t.Errorf("the token requests' resend counts (-want +got):\n%s", diff)
		}
	})
}
