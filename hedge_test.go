package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// slowFirst answers the first request it sees after a minute (unless the
// client gives up on it), and the others at once, recording each one's
// body.
type slowFirst struct {
	mu        sync.Mutex
	n         int
	bodies    []string
	abandoned atomic.Int64
}

func (h *slowFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.n++
	first := h.n == 1
	h.bodies = append(h.bodies, string(b))
	h.mu.Unlock()
	if first {
		select {
		case <-time.After(time.Minute):
		case <-r.Context().Done():
			h.abandoned.Add(1)
			return
		}
	}
	io.WriteString(w, "ok "+r.Method)
}

// TestHedging: a hedge goes after the delay, beside a first attempt that
// has not answered; its answer wins, the first is cancelled (its
// connection let go), the caller gets the winner's body whole. The hedge
// carries resend count 1 and the caller's bytes, is reported to OnRetry
// as a hedge, and spends the budget; an unkeyed POST, a request whose
// policy turns retries off, and a request when the budget is spent are not
// hedged.
func TestHedging(t *testing.T) {
	for _, tc := range []struct {
		name    string
		method  string
		ctx     func(context.Context) context.Context
		budget  *Budget
		hedged  bool
		headers map[string]string
	}{
		{name: "GET", method: http.MethodGet, hedged: true},
		{name: "PUT with a body", method: http.MethodPut, hedged: true},
		{name: "keyed POST", method: http.MethodPost, hedged: true, headers: map[string]string{"Idempotency-Key": "k1"}},
		{name: "unkeyed POST", method: http.MethodPost},
		{name: "retries off", method: http.MethodGet, ctx: func(ctx context.Context) context.Context {
			return ContextWithPolicy(ctx, PolicyNoRetry())
		}},
		{name: "budget spent", method: http.MethodGet, budget: NewBudget(0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &slowFirst{}
				net := newPipeNet(host)
				defer net.close()
				resends := map[int]int{}
				var mu sync.Mutex
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					resends[ResendCount(r.Context())]++
					mu.Unlock()
					return net.tr.RoundTrip(r)
				})
				var ev events
				opts := []Option{WithBase(base), WithHedging(50 * time.Millisecond), WithOnRetry(ev.add)}
				if tc.budget != nil {
					opts = append(opts, WithBudget(tc.budget))
				}
				tr := New(opts...)
				ctx := context.Background()
				if tc.ctx != nil {
					ctx = tc.ctx(ctx)
				}
				ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				body := ""
				if tc.method != http.MethodGet {
					body = "payload"
				}
				start := time.Now()
				resp, err := sendCtx(ctx, tr, tc.method, "http://hedge.test/x", body, tc.headers)
				if err != nil {
					t.Fatal(err)
				}
				got := readAll(resp)
				took := time.Since(start)
				evs := ev.list()
				if !tc.hedged {
					if took != time.Minute || len(evs) != 0 {
						t.Errorf("took %v with events %+v; want the first attempt's minute and no hedge", took, evs)
					}
					return
				}
				if got != "ok "+tc.method || took != 50*time.Millisecond {
					t.Errorf("got %q after %v; want the hedge's answer after 50ms", got, took)
				}
				if len(evs) != 1 || !evs[0].Hedge || evs[0].Attempt != 1 || evs[0].Delay != 50*time.Millisecond {
					t.Errorf("events %+v; want one hedge of attempt 1 after 50ms", evs)
				}
				mu.Lock()
				if resends[0] != 1 || resends[1] != 1 {
					t.Errorf("resend counts seen below %v; want one first try and one hedge", resends)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				host.mu.Lock()
				if len(host.bodies) != 2 || host.bodies[1] != body {
					t.Errorf("the host read %q; want the caller's bytes twice", host.bodies)
				}
				host.mu.Unlock()
				if host.abandoned.Load() != 1 {
					t.Errorf("the slow first attempt was not cancelled")
				}
			})
		})
	}
}

// TestHedgingLearned: with WithHedging(0), a host whose answers all take
// 50 ms gets no hedge, and one whose answers now and then hang gets them
// after about its 95th percentile.
func TestHedgingLearned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		hang := atomic.Bool{}
		net := newPipeNet(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d := 50 * time.Millisecond
			if hang.Load() && n.Add(1)%10 == 0 {
				d = time.Minute
			}
			select {
			case <-time.After(d):
				io.WriteString(w, "ok")
			case <-r.Context().Done():
			}
		}))
		defer net.close()
		var hedges atomic.Int64
		tr := New(WithBase(net.tr), WithHedging(0), WithOnRetry(func(ev RetryEvent) {
			if ev.Hedge {
				hedges.Add(1)
			}
		}))
		for range 100 {
			if code, _ := get(t, tr, "http://steady.test/"); code != 200 {
				t.Fatal(code)
			}
		}
		if h := hedges.Load(); h != 0 {
			t.Errorf("%d hedges for a host whose answers all take 50ms, want none", h)
		}
		hang.Store(true)
		start := time.Now()
		for range 100 {
			if code, _ := get(t, tr, "http://steady.test/"); code != 200 {
				t.Fatal(code)
			}
		}
		if h, took := hedges.Load(), time.Since(start); h < 9 || h > 12 || took > 100*time.Duration(60)*time.Millisecond+10*60*time.Millisecond {
			t.Errorf("%d hedges, 100 requests in %v; want one per hung request, each about 56 ms late", h, took)
		}
		st, _ := tr.HostStatus(context.Background(), "steady.test")
		if st.State != HostHealthy {
			t.Errorf("host %v, want healthy: a slow answer is not a failure", st.State)
		}
	})
}

// The response a hedged call hands back keeps its attempt's context alive
// until the caller closes its body: a body read slowly is not cut.
func TestHedgeWinnerBodyLives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := newPipeNet(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "8")
			w.(http.Flusher).Flush()
			time.Sleep(time.Second)
			io.WriteString(w, "ok, late")
		}))
		defer net.close()
		tr := New(WithBase(net.tr), WithHedging(time.Hour))
		code, body := get(t, tr, "http://body.test/")
		if code != 200 || !strings.HasPrefix(body, "ok, late") {
			t.Errorf("%d %q; want the body whole", code, body)
		}
	})
}

// BenchmarkHedgeNoFire is the cost of hedging when no hedge is sent: the
// in-memory base answers before any delay, beside the plain success path
// through the same Transport without hedging. The goal (issue 25): fixed
// and learned at most 6 allocations and 2x plain.
func BenchmarkHedgeNoFire(b *testing.B) {
	get, _ := http.NewRequest("GET", "http://api.test/v1/x", nil)
	// The same base behind a plain *http.Transport (the scheme "mem" goes
	// straight to it), the default kind, which needs no nesting mark.
	tr := &http.Transport{}
	tr.RegisterProtocol("mem", memBase{})
	memGet, _ := http.NewRequest("GET", "mem://api.test/v1/x", nil)
	for _, bc := range []struct {
		name string
		rt   http.RoundTripper
		req  *http.Request
	}{
		{"plain", New(WithBase(memBase{})), get},
		{"hedge-fixed", New(WithBase(memBase{}), WithHedging(100*time.Millisecond)), get},
		{"hedge-learned", New(WithBase(memBase{}), WithHedging(0)), get},
		{"transport/plain", New(WithBase(tr)), memGet},
		{"transport/hedge-fixed", New(WithBase(tr), WithHedging(100*time.Millisecond)), memGet},
		{"transport/hedge-learned", New(WithBase(tr), WithHedging(0)), memGet},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := bc.rt.RoundTrip(bc.req)
				if err != nil || resp.StatusCode != 200 {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}

// hangingHost answers in 10 ms, but holds the 3rd and 4th request of every
// ten until the client gives up on it: one request in five, and calls made
// one after another meet two in a row, so that a hedge hangs too.
type hangingHost struct {
	n, running atomic.Int64
}

func (h *hangingHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.running.Add(1)
	defer h.running.Add(-1)
	d := 10 * time.Millisecond
	if n := h.n.Add(1) % 10; n == 3 || n == 4 {
		d = time.Hour
	}
	select {
	case <-time.After(d):
		io.WriteString(w, "ok")
	case <-r.Context().Done(): // the client gave up on it
	}
}

// bodyLedger counts the response bodies a base hands out and those
// closed, each once.
type bodyLedger struct {
	base           http.RoundTripper
	opened, closed atomic.Int64
}

func (b *bodyLedger) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(req)
	if resp != nil {
		b.opened.Add(1)
		resp.Body = &ledgerBody{ReadCloser: resp.Body, l: b}
	}
	return resp, err
}

type ledgerBody struct {
	io.ReadCloser
	l    *bodyLedger
	once sync.Once
}

func (b *ledgerBody) Close() error {
	b.once.Do(func() { b.l.closed.Add(1) })
	return b.ReadCloser.Close()
}

// TestHedgeRehedgesHungHedge: a hedge that meets a hung request too is
// hedged in turn, after another delay, so that every call of 200 made one
// after another to a host that holds one request in five (two in a row
// now and then) gets its page, none slower than 4 hedge delays and the
// host's 10 ms, with the fixed delay and with the learned one (250 ms
// before any latency is known). Every hung attempt is cancelled (the host
// has nothing running at the end) and every body closed.
func TestHedgeRehedgesHungHedge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // WithHedging's
		bound time.Duration // the slowest call at most
	}{
		{"fixed", 100 * time.Millisecond, 4*100*time.Millisecond + 10*time.Millisecond},
		{"learned", 0, 4*hedgeStart + 10*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &hangingHost{}
				net := newPipeNet(host)
				defer net.close()
				base := &bodyLedger{base: net.tr}
				var rehedged atomic.Int64 // hedges of a hedge
				var giveUps events
				tr := New(WithBase(base), WithHedging(tc.delay), WithOnRetry(func(ev RetryEvent) {
					if ev.Hedge && ev.Attempt == 2 {
						rehedged.Add(1)
					}
				}), WithOnGiveUp(giveUps.add))
				var slowest time.Duration
				for i := range 200 {
					start := time.Now()
					code, body := get(t, tr, "http://hangs.test/")
					if code != 200 || body != "ok" {
						t.Fatalf("call %d: %d %q, want the page", i, code, body)
					}
					slowest = max(slowest, time.Since(start))
				}
				synctest.Wait() // the cancelled attempts let go
				if slowest > tc.bound {
					t.Errorf("slowest call %v, want at most %v", slowest, tc.bound)
				}
				if rehedged.Load() == 0 {
					t.Errorf("no hedge was hedged: the test meets no hung hedge")
				}
				if evs := giveUps.list(); len(evs) != 0 {
					t.Errorf("hedges not sent: %+v", evs)
				}
				if n := host.running.Load(); n != 0 {
					t.Errorf("%d requests still running at the host: attempts leaked", n)
				}
				if o, c := base.opened.Load(), base.closed.Load(); o != c {
					t.Errorf("%d bodies closed of %d", c, o)
				}
				t.Logf("%d requests, %d hedges of a hedge, slowest %v", host.n.Load(), rehedged.Load(), slowest)
			})
		})
	}
}

// TestHedgeLatencySampled: a host's calls are each timed for the learned
// delay until its ring is full, then one in latencySample, and each again
// once it has been quiet past latencyForget; over a Transport, 64 calls
// and 400 more to a quick host record 64 and 100 latencies.
func TestHedgeLatencySampled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripFunc(func(*http.Request) (*http.Response, error) {
			time.Sleep(time.Millisecond)
			return canned(200, "ok"), nil
		})
		tr := New(WithBase(base), WithHedging(0))
		get := func(n int) {
			for range n {
				resp, err := tr.RoundTrip(httptest.NewRequest("GET", "http://quick.test/", nil))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
		}
		recorded := func() uint64 { return tr.latencies.lookup("quick.test").n.Load() }
		get(64)
		if got := recorded(); got != 64 {
			t.Errorf("first 64 calls recorded %d latencies, want each", got)
		}
		get(400)
		if got := recorded(); got != 64+100 {
			t.Errorf("400 calls once full recorded %d latencies, want 100 more", got-64)
		}
		time.Sleep(latencyForget + time.Second)
		get(1)
		if got := recorded(); got != 1 {
			t.Errorf("after a quiet minute, the first call recorded %d latencies, want a fresh ring of 1", got)
		}
	})
}

// TestHedgeLatencyTable: the learned delay's latencies are the last 64 of
// a host, their 95th percentile the 61st of them in order; a host quiet
// past latencyForget counts as never seen, and starts afresh; a thousand hosts keep at most
// latencySlots records, and a busy host keeps its own among them.
func TestHedgeLatencyTable(t *testing.T) {
	lt := newLatencyTable()
	now := time.Unix(1e9, 0)
	for i := range 104 { // the last 64: 41..104 ms (worked out every eighth answer)
		lt.add("busy.test", nil, time.Duration(i+1)*time.Millisecond, now)
	}
	if got, want := lt.p95("busy.test", now), 101*time.Millisecond; got != want {
		t.Errorf("p95 %v, want %v (the 61st of 41..104 ms)", got, want)
	}
	lt.add("one.test", nil, 7*time.Millisecond, now)
	if got := lt.p95("one.test", now); got != 7*time.Millisecond {
		t.Errorf("p95 of one answer %v, want it", got)
	}
	later := now.Add(latencyForget + time.Second)
	if got := lt.p95("one.test", later); got != 0 {
		t.Errorf("p95 of a host quiet past latencyForget %v, want none", got)
	}
	lt.add("busy.test", nil, time.Millisecond, later)
	if got := lt.p95("busy.test", later); got != time.Millisecond {
		t.Errorf("p95 of a host back after latencyForget %v, want its new answer's alone", got)
	}
	now = later
	for i := range 1000 {
		now = now.Add(time.Millisecond)
		lt.add(fmt.Sprintf("h%d.test", i), nil, time.Millisecond, now)
		lt.add("busy.test", nil, 100*time.Millisecond, now)
	}
	records := 0
	for i := range lt.slots {
		if lt.slots[i].Load() != nil {
			records++
		}
	}
	if records > latencySlots || lt.p95("busy.test", now) != 100*time.Millisecond {
		t.Errorf("%d records, busy host's p95 %v; want at most %d and its own kept", records, lt.p95("busy.test", now), latencySlots)
	}
}

// TestHedgeFirstAttemptContext: the first attempt of a hedged call runs on
// a context of the hedger's own, which ends with the caller's (a
// deadline), also under an attempt timeout (a context made from it), and
// carries the caller's values.
func TestHedgeFirstAttemptContext(t *testing.T) {
	type key struct{}
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"hedging", nil},
		{"hedging and an attempt timeout", []Option{WithAttemptTimeout(time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var value atomic.Value
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					value.Store(r.Context().Value(key{}))
					<-r.Context().Done()
					return nil, r.Context().Err()
				})
				tr := New(append([]Option{WithBase(base), WithHedging(time.Hour)}, tc.opts...)...)
				ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Second)
				defer cancel()
				start := time.Now()
				_, err := sendCtx(ctx, tr, http.MethodGet, "http://ctx.test/", "", nil)
				if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
					t.Errorf("%v after %v; want the caller's deadline after 1s", err, time.Since(start))
				}
				if v := value.Load(); v != "v" {
					t.Errorf("the base saw value %v, want the caller's", v)
				}
			})
		})
	}
}

// ctxBody is a body that reads only while its attempt's context lives.
type ctxBody struct {
	ctx context.Context
	r   *strings.Reader
}

func (b *ctxBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	return b.r.Read(p)
}

func (b *ctxBody) Close() error { return nil }

// TestHedgerHandedOn: a hedger whose call was answered before its delay
// is handed on to the next call (hedgetimer.go), outside any synctest
// bubble; calls answered at once and calls that hedge, side by side on
// several goroutines, each get their own answer, and an answer kept while
// later calls run still reads (its first attempt's context is its own).
func TestHedgerHandedOn(t *testing.T) {
	if !noBubble(time.Now()) {
		t.Fatal("outside any bubble, the clock has no monotonic reading")
	}
	synctest.Test(t, func(t *testing.T) {
		if noBubble(time.Now()) {
			t.Error("inside a bubble, the clock has a monotonic reading")
		}
	})
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		id := r.Header.Get("X-Id")
		if strings.HasPrefix(id, "slow") && ResendCount(r.Context()) == 0 {
			<-r.Context().Done() // the first, until the hedge's answer ends it
			return nil, r.Context().Err()
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Request: r,
			Body: &ctxBody{ctx: r.Context(), r: strings.NewReader(id)}}, nil
	})
	tr := New(WithBase(base), WithHedging(5*time.Millisecond))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			var kept []*http.Response
			for i := range 60 {
				id := fmt.Sprintf("fast-%d-%d", g, i)
				if i%6 == 5 {
					id = fmt.Sprintf("slow-%d-%d", g, i)
				}
				req, _ := http.NewRequest(http.MethodGet, "http://handed.test/", nil)
				req.Header.Set("X-Id", id)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Errorf("%s: %v", id, err)
					return
				}
				if i%10 == 0 {
					kept = append(kept, resp) // read after later calls
					continue
				}
				if b, err := io.ReadAll(resp.Body); err != nil || string(b) != id {
					t.Errorf("%s: got %q, %v", id, b, err)
				}
				resp.Body.Close()
			}
			for _, resp := range kept {
				id := resp.Request.Header.Get("X-Id")
				if b, err := io.ReadAll(resp.Body); err != nil || string(b) != id {
					t.Errorf("%s, kept: got %q, %v", id, b, err)
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// TestHedgerTimerSetSooner: a hedger handed on with its timer still set
// for its last call's moment (hedgetimer.go) has it set again by a call
// whose hedge is due sooner. A call to a host never seen (hedged after
// hedgeStart, 250 ms) is answered at once and hands its hedger on; the
// next call, to a host whose latencies are known (hedged after the 50 ms
// floor), meets a hung first attempt: its hedge goes after 50 ms, not at
// the 250 ms its hedger's timer was set for. On the real clock, one
// goroutine, so that the hedger is the one handed on.
func TestHedgerTimerSetSooner(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("X-Hang") != "" && ResendCount(r.Context()) == 0 {
			<-r.Context().Done() // until the hedge's answer ends it
			return nil, r.Context().Err()
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Request: r, Body: http.NoBody}, nil
	})
	tr := New(WithBase(base), WithHedging(0))
	get := func(host string, hang bool) time.Duration {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
		if hang {
			req.Header.Set("X-Hang", "1")
		}
		began := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		resp.Body.Close()
		return time.Since(began)
	}
	get("known.test", false) // its latency is known from now on: hedged after the floor
	for i := range 3 {
		get(fmt.Sprintf("new-%d.test", i), false) // hedgeStart: the timer is set 250 ms ahead
		if took := get("known.test", true); took >= 200*time.Millisecond {
			t.Errorf("round %d: a hung call hedged after %v; want about the 50 ms floor, not the 250 ms its hedger's timer was set for", i, took)
		}
	}
}
