package retryhttp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Regression tests for issue #25: hedges and attempt timeouts.

// slowBase answers after the delay its answer function names (or when the
// attempt's context ends), with what answer returns; n is the attempt's
// number among all the base saw, from 1.
type slowBase struct {
	mu     sync.Mutex
	n      int
	at     []time.Duration // when each attempt reached the base, since start
	start  time.Time
	answer func(n int) (time.Duration, *http.Response)
}

func (b *slowBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.n++
	n := b.n
	b.at = append(b.at, time.Since(b.start))
	b.mu.Unlock()
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	d, resp := b.answer(n)
	select {
	case <-time.After(d):
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	resp.Request = r
	return resp, nil
}

func (b *slowBase) arrivals() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Duration(nil), b.at...)
}

func getReq(t *testing.T, rt http.RoundTripper, u string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

// TestNilBodyIsNoBody: a base that answers with a nil Body hands the
// caller http.NoBody under WithAttemptTimeout and WithHedging, and a hedge
// that loses with a nil body is cleaned up without a panic.
func TestNilBodyIsNoBody(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []Option
		first time.Duration // how long the first attempt takes
		hedge time.Duration // how long the others take
	}{
		{name: "attempt timeout", opts: []Option{WithAttemptTimeout(time.Second)}},
		{name: "hedging, no hedge", opts: []Option{WithHedging(time.Second)}},
		{name: "hedging, the hedge wins", opts: []Option{WithHedging(10 * time.Millisecond)}, first: time.Minute},
		{name: "hedging, the hedge loses", opts: []Option{WithHedging(10 * time.Millisecond)}, first: 20 * time.Millisecond, hedge: time.Second},
		{name: "plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowBase{start: time.Now(), answer: func(n int) (time.Duration, *http.Response) {
					d := tc.hedge
					if n == 1 {
						d = tc.first
					}
					return d, &http.Response{StatusCode: 200, Header: http.Header{}}
				}}
				tr := New(append([]Option{WithBase(base)}, tc.opts...)...)
				resp, err := getReq(t, tr, "http://nil.test/")
				if err != nil {
					t.Fatal(err)
				}
				if resp.Body == nil {
					t.Fatal("nil body, want http.NoBody")
				}
				if b, err := io.ReadAll(resp.Body); err != nil || len(b) != 0 {
					t.Errorf("read %q, %v; want nothing", b, err)
				}
				if err := resp.Body.Close(); err != nil {
					t.Error(err)
				}
				synctest.Wait() // the lost hedge's clean-up
				time.Sleep(2 * time.Second)
				synctest.Wait()
			})
		})
	}
}

// TestHedgeFinalFirstAnswerReturnsAtOnce: a first answer that parks the
// host (503, Retry-After: 120) comes back at once, body unread: beside a
// hedge that still waits for its pace slot, which is abandoned (never
// sent, never reported), and beside hedges in flight, which are cancelled.
func TestHedgeFinalFirstAnswerReturnsAtOnce(t *testing.T) {
	type result struct {
		Code   int
		Body   string
		ReadOK bool
		Took   time.Duration
		Sent   int
		Hedges int64
	}
	for _, tc := range []struct {
		name string
		opts []Option
		want result
	}{
		{name: "hedge waiting for its slot", opts: []Option{WithPace(0.1, 1)},
			want: result{503, "busy", true, 50 * time.Millisecond, 1, 0}},
		// Two hedges in flight: the first at 10 ms, and, that one still
		// unanswered, another at 20 ms.
		{name: "hedge in flight",
			want: result{503, "busy", true, 50 * time.Millisecond, 3, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowBase{start: time.Now(), answer: func(n int) (time.Duration, *http.Response) {
					d := 50 * time.Millisecond
					if n > 1 {
						d = time.Minute // the hedge
					}
					h := http.Header{"Retry-After": {"120"}}
					return d, &http.Response{StatusCode: 503, Header: h,
						Body: io.NopCloser(strings.NewReader("busy")), ContentLength: 4}
				}}
				var hedges atomic.Int64
				tr := New(append([]Option{WithBase(base), WithHedging(10 * time.Millisecond),
					WithOnRetry(func(ev RetryEvent) {
						if ev.Hedge {
							hedges.Add(1)
						}
					})}, tc.opts...)...)
				start := time.Now()
				resp, err := getReq(t, tr, "http://parks.test/")
				if err != nil {
					t.Fatal(err)
				}
				took := time.Since(start)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				synctest.Wait() // the cancelled hedge lets go
				got := result{resp.StatusCode, string(b), err == nil, took, len(base.arrivals()), hedges.Load()}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("(-want +got)\n%s", diff)
				}
			})
		})
	}
}

// TestPaceGiveBackNeverShares: under WithPace(0.1, 1), a caller that gives
// up its wait for a slot while later slots were handed out does not let
// two attempts reach the host at the same moment.
func TestPaceGiveBackNeverShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowBase{start: time.Now(), answer: func(int) (time.Duration, *http.Response) {
			return 0, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
		}}
		tr := New(WithBase(base), WithPace(0.1, 1))
		var wg sync.WaitGroup
		send := func(ctx context.Context) {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://paced.test/", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		wg.Add(3)
		go send(context.Background()) // slot at 0
		synctest.Wait()
		quitter, quit := context.WithCancel(context.Background())
		go send(quitter) // slot at 10 s
		synctest.Wait()
		go send(context.Background()) // slot at 20 s
		synctest.Wait()
		time.Sleep(time.Second)
		quit() // gives up the 10 s slot, after the 20 s one was handed out
		synctest.Wait()
		wg.Add(1)
		go send(context.Background())
		wg.Wait()
		at := base.arrivals()
		for i := range at {
			for j := range i {
				if d := at[i] - at[j]; d > -10*time.Second && d < 10*time.Second {
					t.Errorf("attempts at %v and %v, less than the 10 s interval apart (all: %v)", at[j], at[i], at)
				}
			}
		}
	})
}

// countedBody is a request body whose GetBody counts the copies opened and
// closed, as a GetBody that opens a file would hold a descriptor each.
type countedBody struct{ opened, closed atomic.Int64 }

func (c *countedBody) get() (io.ReadCloser, error) {
	c.opened.Add(1)
	return &countedCopy{Reader: strings.NewReader("payload"), c: c}, nil
}

type countedCopy struct {
	io.Reader
	c    *countedBody
	once sync.Once
}

func (b *countedCopy) Close() error {
	b.once.Do(func() { b.c.closed.Add(1) })
	return nil
}

// pacedHedges runs n PUTs with a GetBody body to a host paced at one a
// second whose answers take 50 ms, hedged after 10 ms: every hedge waits
// for its slot and loses to the first attempt before it comes. The n+1st
// request's first answer is a 503. It returns the base, the body counts,
// the hedge events and the give-ups.
func pacedHedges(t *testing.T, n int) (*slowBase, *countedBody, []RetryEvent, []RetryEvent) {
	base := &slowBase{start: time.Now(), answer: func(i int) (time.Duration, *http.Response) {
		if i == n+1 {
			return 50 * time.Millisecond, &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody}
		}
		return 50 * time.Millisecond, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
	}}
	var (
		mu              sync.Mutex
		hedges, giveUps []RetryEvent
	)
	tr := New(WithBase(base), WithPace(1, 1), WithHedging(10*time.Millisecond),
		WithOnRetry(func(ev RetryEvent) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Hedge {
				ev.Request = nil
				hedges = append(hedges, ev)
			}
		}),
		WithOnGiveUp(func(ev RetryEvent) {
			mu.Lock()
			defer mu.Unlock()
			ev.Request, ev.Err = nil, nil
			giveUps = append(giveUps, ev)
		}))
	body := &countedBody{}
	for range n + 1 {
		req, _ := http.NewRequest(http.MethodPut, "http://paced.test/", strings.NewReader("payload"))
		req.GetBody = body.get
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	synctest.Wait()
	mu.Lock()
	defer mu.Unlock()
	return base, body, hedges, giveUps
}

// TestHedgeUnsentOpensNoBody: a hedge that never went never asked GetBody
// for a body, and every body it opened is closed.
func TestHedgeUnsentOpensNoBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, body, _, _ := pacedHedges(t, 5)
		// The 503's retry opens one.
		if o, c := body.opened.Load(), body.closed.Load(); o != 1 || c != 1 {
			t.Errorf("GetBody opened %d bodies, %d closed; want the retry's one, closed", o, c)
		}
	})
}

// TestHedgeUnsentKeepsNoBudget: twenty hedges that never went spend no
// budget: the 503 after them is retried.
func TestHedgeUnsentKeepsNoBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, _, _, giveUps := pacedHedges(t, 20)
		if diff := cmp.Diff([]RetryEvent(nil), giveUps); diff != "" {
			t.Errorf("give-ups (-want +got)\n%s", diff)
		}
		if n := len(base.arrivals()); n != 22 {
			t.Errorf("%d attempts, want 22: 21 first tries, the 503's retry", n)
		}
	})
}

// TestHedgeReportedWhenSent: a hedge that never went is not reported; one
// that goes is, once.
func TestHedgeReportedWhenSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, hedges, _ := pacedHedges(t, 3)
		if len(hedges) != 0 {
			t.Errorf("%d hedges reported, none sent: %+v", len(hedges), hedges)
		}
		base := &slowBase{start: time.Now(), answer: func(n int) (time.Duration, *http.Response) {
			d := 10 * time.Millisecond
			if n == 1 {
				d = time.Minute
			}
			return d, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
		}}
		var events []RetryEvent
		tr := New(WithBase(base), WithHedging(20*time.Millisecond), WithOnRetry(func(ev RetryEvent) {
			ev.Request = nil
			events = append(events, ev)
		}))
		resp, err := getReq(t, tr, "http://hedged.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		synctest.Wait()
		if diff := cmp.Diff([]RetryEvent{{Attempt: 1, Delay: 20 * time.Millisecond, Hedge: true}}, events); diff != "" {
			t.Errorf("events (-want +got)\n%s", diff)
		}
	})
}

// timeoutErr is a net.Error that timed out, as a dial or a header
// timeout of net/http's is.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestTimeoutIsNetTimeout: every timeout the Transport returns is a
// timeout to net.Error through the *url.Error of an http.Client.
func TestTimeoutIsNetTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		base http.RoundTripper
		opts []Option
	}{
		{name: "attempt timeout", base: &slowBase{answer: func(int) (time.Duration, *http.Response) {
			return time.Minute, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
		}}, opts: []Option{WithAttemptTimeout(10 * time.Millisecond)}},
		{name: "attempt timeout, not retried", base: &slowBase{answer: func(int) (time.Duration, *http.Response) {
			return time.Minute, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
		}}, opts: []Option{WithAttemptTimeout(10 * time.Millisecond), WithMaxAttempts(1)}},
		{name: "dial timeout", base: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
		})},
		{name: "header timeout", base: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, timeoutErr{}
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &http.Client{Transport: New(append([]Option{WithBase(tc.base)}, tc.opts...)...)}
				_, err := c.Get("http://slow.test/")
				var ue *url.Error
				var ne net.Error
				if !errors.As(err, &ue) || !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("%v (%T): not a timeout to net.Error", err, err)
				}
			})
		})
	}
}

// TestHedgeLearnedFirstWave: with the learned delay (WithHedging(0)) a
// call that hangs before any latency is known is hedged after the
// starting delay, and one that hangs later after the learned one; with
// learning off (WithLearning(false)) too, whose latencies are kept for
// the hedge delay alone. A steady host is not hedged.
func TestHedgeLearnedFirstWave(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{name: "learning", opts: []Option{WithHedging(0)}},
		{name: "learning off", opts: []Option{WithHedging(0), WithLearning(false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The first request hangs, and the 100th after it.
				base := &slowBase{start: time.Now(), answer: func(n int) (time.Duration, *http.Response) {
					d := 50 * time.Millisecond
					if n == 1 || n == 103 {
						d = time.Minute
					}
					return d, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
				}}
				var hedges atomic.Int64
				tr := New(append([]Option{WithBase(base), WithOnRetry(func(ev RetryEvent) {
					if ev.Hedge {
						hedges.Add(1)
					}
				})}, tc.opts...)...)
				took := func() time.Duration {
					start := time.Now()
					resp, err := getReq(t, tr, "http://wave.test/")
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					return time.Since(start)
				}
				type result struct {
					First, Later time.Duration
					Hedges       int64
				}
				var got result
				got.First = took()
				for range 100 {
					took()
				}
				got.Later = took()
				got.Hedges = hedges.Load()
				// 50 ms answers: hedged after 50 ms and an eighth.
				want := result{First: hedgeStart + 50*time.Millisecond, Later: 50*time.Millisecond + 50*time.Millisecond/8 + 50*time.Millisecond, Hedges: 2}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("(-want +got)\n%s", diff)
				}
			})
		})
	}
}

// getSlow is a GET to the host of TestHedgeNotSentIsReported.
func getSlow() *http.Request {
	r, _ := http.NewRequest(http.MethodGet, "http://slow.test/", nil)
	return r
}

// TestHedgeNotSentIsReported: a call slower than its hedge delay whose
// hedge cannot go says why, to OnGiveUp, as a hedge event; so does one
// whose attempts are all slow when no more may go.
func TestHedgeNotSentIsReported(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		req  func() *http.Request
		want Reason
		// attempt is how many were in flight when the hedge was due: 1
		// unless hedges went and were slow too.
		attempt int
	}{
		{name: "budget spent", opts: []Option{WithBudget(NewBudget(0, 0))}, want: ReasonBudget,
			req: getSlow, attempt: 1},
		{name: "GetBody fails", want: ReasonGetBody, attempt: 1, req: func() *http.Request {
			r, _ := http.NewRequest(http.MethodPut, "http://slow.test/", strings.NewReader("x"))
			r.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
			return r
		}},
		// Hedged at 10 and 20 ms, all three slow: at 30 ms no more may go.
		{name: "out of attempts", want: ReasonAttempts, req: getSlow, attempt: 3},
		{name: "out of attempts, 2 at most", opts: []Option{WithMaxAttempts(2)}, want: ReasonAttempts, req: getSlow, attempt: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowBase{start: time.Now(), answer: func(int) (time.Duration, *http.Response) {
					return time.Second, &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
				}}
				var events []RetryEvent
				tr := New(append([]Option{WithBase(base), WithHedging(10 * time.Millisecond), WithOnGiveUp(func(ev RetryEvent) {
					ev.Request = nil
					events = append(events, ev)
				})}, tc.opts...)...)
				resp, err := tr.RoundTrip(tc.req())
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				want := []RetryEvent{{Attempt: tc.attempt, Delay: 10 * time.Millisecond, Reason: tc.want, Hedge: true}}
				if diff := cmp.Diff(want, events); diff != "" {
					t.Errorf("give-ups (-want +got)\n%s", diff)
				}
			})
		})
	}
}

// TestHedgedCallRetriesOnLiveContext: over a base that is not net/http's,
// the call's request is its hedged first attempt's too (markedHedger), on
// the first's context, which ends once a hedge's answer is taken. What is
// made from it after (a retry of the hedge's failure, a hedge that wins)
// takes the context the first had before: a retry then reaches the base
// on a live context, and a hedge's winning body is read whole after the
// first was cancelled.
func TestHedgedCallRetriesOnLiveContext(t *testing.T) {
	type result struct {
		Code     int
		Body     string
		Attempts int
		Live     []bool // each attempt's context alive when it reached the base
	}
	for _, tc := range []struct {
		name string
		// answer is attempt n's delay, status and body; the hedge is 2.
		answer func(n int) (time.Duration, int, string)
		want   result
	}{
		{name: "retry after a hedge's failure",
			answer: func(n int) (time.Duration, int, string) {
				switch n {
				case 1:
					return 150 * time.Millisecond, 503, "first"
				case 2:
					return 100 * time.Millisecond, 503, "hedge"
				}
				return 10 * time.Millisecond, 200, "retry"
			},
			want: result{200, "retry", 3, []bool{true, true, true}}},
		{name: "hedge wins",
			answer: func(n int) (time.Duration, int, string) {
				if n == 1 {
					return time.Minute, 200, "first"
				}
				return 10 * time.Millisecond, 200, "hedge"
			},
			want: result{200, "hedge", 2, []bool{true, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu   sync.Mutex
					live []bool
				)
				base := &slowBase{start: time.Now(), answer: func(n int) (time.Duration, *http.Response) {
					d, code, body := tc.answer(n)
					return d, &http.Response{StatusCode: code, Header: http.Header{},
						Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
				}}
				probe := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					live = append(live, r.Context().Err() == nil)
					mu.Unlock()
					resp, err := base.RoundTrip(r)
					if resp != nil { // a body that reads only while its attempt's context lives, as net/http's
						b, _ := io.ReadAll(resp.Body)
						resp.Body = &ctxBody{ctx: r.Context(), r: strings.NewReader(string(b))}
					}
					return resp, err
				})
				tr := New(WithBase(probe), WithHedging(100*time.Millisecond), WithMaxAttempts(3))
				resp, err := getReq(t, tr, "http://live.test/")
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // what the first's end sets going has run
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Errorf("reading the answer: %v", err)
				}
				resp.Body.Close()
				synctest.Wait()
				mu.Lock()
				got := result{resp.StatusCode, string(b), len(base.arrivals()), live}
				mu.Unlock()
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("(-want +got)\n%s", diff)
				}
			})
		})
	}
}
