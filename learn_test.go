package retryhttp

// Issue 10: learning each host's capacity. The lab (examples/lab) and the
// real middlewares (bench/TestLimiters) show the figures; these tests pin
// the behaviour each rule promises, on a virtual clock.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"
)

// workers runs n goroutines that each send GETs to url through rt until d
// has passed on the bubble's clock, and returns the 200s they got.
func workers(t *testing.T, rt http.RoundTripper, url string, n int, d time.Duration) int {
	t.Helper()
	var ok atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for i := 0; time.Now().Before(end) && i < 100_000; i++ {
				resp, err := send(rt, http.MethodGet, url, "", nil)
				if err != nil {
					continue
				}
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				}
				readAll(resp)
			}
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// noisyHost answers after 10 ms, and 503 (no Retry-After) to 1 % of
// requests at random, whatever the load.
type noisyHost struct {
	mu  sync.Mutex
	rnd *rand.Rand
}

func (h *noisyHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	time.Sleep(10 * time.Millisecond)
	h.mu.Lock()
	fail := h.rnd.Float64() < 0.01
	h.mu.Unlock()
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ok"))
}

// Noise is not overload: a host that fails 1 % of requests at random keeps
// at least 95 % of the throughput it has with learning off.
func TestLearnNoiseKeepsThroughput(t *testing.T) {
	run := func(learning bool) int {
		var got int
		synctest.Test(t, func(t *testing.T) {
			net := newPipeNet(&noisyHost{rnd: rand.New(rand.NewPCG(7, 7))})
			defer net.close()
			tr := New(WithBase(net.tr), WithLearning(learning), fixedRand(0.5))
			got = workers(t, tr, "http://noisy.test/", 20, 20*time.Second)
		})
		return got
	}
	off, on := run(false), run(true)
	t.Logf("20 workers, 20 s, 1 %% random 503: %d served without learning, %d with", off, on)
	if on*100 < off*95 {
		t.Errorf("learning kept %d of %d (%.1f %%), want at least 95 %%", on, off, 100*float64(on)/float64(off))
	}
}

// A host that never refuses and announces nothing is never paced, and the
// limiter keeps nothing of it: its requests stay on the success path.
func TestLearnNeverRefusedNeverPaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := newPipeNet(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(10 * time.Millisecond)
			w.Write([]byte("ok"))
		}))
		defer net.close()
		tr := New(WithBase(net.tr))
		workers(t, tr, "http://fine.test/", 10, 5*time.Second)
		p, err := tr.HostPace(context.Background(), "fine.test")
		if err != nil || !p.Unlimited() {
			t.Errorf("HostPace = %+v, %v; want unlimited", p, err)
		}
		if l := tr.limiter.(*localLimiter); l.learning.Load() != 0 || relHostEntries(tr) != 0 {
			t.Errorf("the limiter keeps %d learning hosts, %d entries; want none", l.learning.Load(), relHostEntries(tr))
		}
	})
}

// quotaHost announces 10 per 1 s window on every answer, the reset as a
// delay, and refuses the 11th in a window with 429 and Retry-After: 1.
type quotaHost struct {
	mu     sync.Mutex
	window int64
	used   int
	hits   int
}

func (h *quotaHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	h.mu.Lock()
	h.hits++
	if sec := now.Unix(); sec != h.window {
		h.window, h.used = sec, 0
	}
	refuse := h.used >= 10
	if !refuse {
		h.used++
	}
	left := 10 - h.used
	h.mu.Unlock()
	w.Header().Set("X-RateLimit-Limit", "10")
	w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(left))
	w.Header().Set("X-RateLimit-Reset", "1")
	if refuse {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	w.Write([]byte("ok"))
}

// An announced quota holds the host from the first answer, readable with
// HostPace, said once in the log; a configured pace stays an upper bound;
// learning off leaves the host unpaced.
func TestLearnAnnouncedQuota(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want rate.Limit
		took time.Duration // for 30 more pages, at most
	}{
		{"learning", nil, 10, 4 * time.Second},
		{"configured pace below it", []Option{WithPace(4, 1)}, 4, 8 * time.Second},
		{"learning off", []Option{WithLearning(false)}, rate.Inf, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &quotaHost{}
				net := newPipeNet(host)
				defer net.close()
				var log bytes.Buffer
				logger := slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{
					ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
						if a.Key == slog.TimeKey {
							return slog.Attr{}
						}
						return a
					}}))
				tr := New(append([]Option{WithBase(net.tr), WithLogger(logger)}, tc.opts...)...)
				if code, _ := get(t, tr, "http://quota.test/"); code != 200 {
					t.Fatalf("first request: %d", code)
				}
				p, err := tr.HostPace(context.Background(), "QUOTA.test:80")
				if err != nil || p.Limit != tc.want {
					t.Errorf("HostPace = %+v, %v; want %v a second", p, err, tc.want)
				}
				learned := strings.Count(log.String(), `msg="retryhttp: quota" host=quota.test limit=10 window=1s`)
				if wantLines := map[bool]int{true: 0, false: 1}[tc.name == "learning off"]; learned != wantLines {
					t.Errorf("%d log lines for the quota, want %d:\n%s", learned, wantLines, log.String())
				}
				// 30 more pages by 3 workers: within the quota, one
				// refused at most (it holds the 9 the first answer said
				// were left, then 10 a window).
				start := time.Now()
				var wg sync.WaitGroup
				for range 3 {
					wg.Go(func() {
						for range 10 {
							get(t, tr, "http://quota.test/")
						}
					})
				}
				wg.Wait()
				took := time.Since(start)
				if tc.took > 0 && (host.hits > 32 || took > tc.took) {
					t.Errorf("%d requests for 31 pages in %v; want at most one refused, within %v", host.hits, took, tc.took)
				}

			})
		})
	}
}

// Contradictory and absurd announcements are ignored, never a hang: a
// zero or huge window, a huge quota, garbage.
func TestLearnAbsurdAnnouncements(t *testing.T) {
	for _, h := range []map[string]string{
		{"Ratelimit-Policy": "10;w=0"},
		{"Ratelimit-Policy": "100000000;w=1"},
		{"Ratelimit-Policy": "0;w=1"},
		{"Ratelimit-Policy": "10;w=999999999"},
		{"X-Ratelimit-Limit": "99999999999", "X-Ratelimit-Reset": "1"},
		{"X-Ratelimit-Limit": "-5", "X-Ratelimit-Reset": "1"},
		{"X-Ratelimit-Limit": "10"}, // no window, no reset
		{"X-Ratelimit-Limit": "ten", "X-Ratelimit-Reset": "1"},
	} {
		t.Run(fmt.Sprint(h), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(map[string][]step{"/": {{status: 200, headers: h}}})
				net := newPipeNet(host)
				defer net.close()
				tr := New(WithBase(net.tr))
				start := time.Now()
				for range 50 {
					get(t, tr, "http://absurd.test/")
				}
				if took := time.Since(start); took > time.Second {
					t.Errorf("50 requests took %v: the announcement paced the host", took)
				}
			})
		})
	}
}

// A host that refuses without numbers is paced below what it accepted,
// and the pace grows back when the host can take more.
func TestLearnRefusalsCutAndGrowBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var capacity atomic.Int64
		capacity.Store(5)
		var mu sync.Mutex
		seen := map[int64]int64{}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(10 * time.Millisecond)
			sec := time.Now().Unix()
			mu.Lock()
			seen[sec]++
			busy := seen[sec] > capacity.Load()
			mu.Unlock()
			if busy {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ok"))
		})
		net := newPipeNet(h)
		defer net.close()
		tr := New(WithBase(net.tr), WithBudget(nil), WithMaxAttempts(20))
		served := workers(t, tr, "http://cap.test/", 30, 10*time.Second)
		p, _ := tr.HostPace(context.Background(), "cap.test")
		if p.Unlimited() || p.Limit > 6.5 || p.Limit < 3.5 {
			t.Errorf("pace %v after 10 s at 5 a second, want about 5", p.Limit)
		}
		if served < 40 {
			t.Errorf("%d served in 10 s at 5 a second, want at least 40", served)
		}
		capacity.Store(40)
		served = workers(t, tr, "http://cap.test/", 30, 10*time.Second)
		// Learning off would serve 400; three times the 5 a second of
		// before shows the pace followed the host up within seconds.
		if served < 150 {
			t.Errorf("%d served in the 10 s after the host took 40 a second, want at least 150", served)
		}
	})
}

// No spurious ErrHostPaused: 30 workers behind WithPace(10, 10) against a
// host that parks itself every second (its 429s say Retry-After: 1) wait
// out each parking, however often it comes, and are never failed with a
// moment no server named.
func TestLearnNoSpuriousHostPaused(t *testing.T) {
	for _, learning := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			net := newPipeNet(&quotaHost{})
			defer net.close()
			tr := New(WithBase(net.tr), WithPace(10, 10), WithLearning(learning), WithMaxAttempts(10))
			var paused, served atomic.Int64
			var wg sync.WaitGroup
			for range 30 {
				wg.Go(func() {
					for range 5 {
						resp, err := send(tr, http.MethodGet, "http://parks.test/", "", nil)
						switch {
						case err != nil:
							paused.Add(1)
							t.Logf("error: %v", err)
						case resp.StatusCode == http.StatusOK:
							served.Add(1)
						}
						if resp != nil {
							readAll(resp)
						}
					}
				})
			}
			wg.Wait()
			if paused.Load() != 0 || served.Load() != 150 {
				t.Errorf("learning %v: %d served, %d failed; want 150 and none", learning, served.Load(), paused.Load())
			}
		})
	}
}

// windowHost counts a quota of limit per window the way the middlewares
// of bench/ do, with its windows starting when it starts (not on a whole
// second) and its reset said as a Unix time truncated to the second, as
// X-RateLimit-Reset is:
//
//   - sliding: a sliding-window counter (go-chi/httprate's kind): the last
//     window's count weighted by what is left of it, plus this one's,
//     rounded; a refusal names the whole window as its Retry-After.
//   - fixed, aligned: a window on its own grid, whole again at its end.
//   - fixed, from the first request (ulule/limiter's kind): a window opens
//     with the first request after the last one closed, its last instant
//     included, and refusals count too; a refusal names no wait.
type windowHost struct {
	kind    string
	limit   int
	window  time.Duration
	start   time.Time
	mu      sync.Mutex
	opened  time.Time // the current window's start
	count   int       // requests counted in it
	prev    int       // counted in the window before (sliding)
	hits    int
	refused []time.Duration // since start
}

func (h *windowHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	h.mu.Lock()
	h.hits++
	if h.opened.IsZero() {
		h.opened = h.start
	}
	for h.kind != "first request" && !now.Before(h.opened.Add(h.window)) {
		h.opened, h.prev, h.count = h.opened.Add(h.window), h.count, 0
		if now.Sub(h.opened) >= h.window {
			h.prev = 0
		}
	}
	if h.kind == "first request" && now.After(h.opened.Add(h.window)) {
		h.opened, h.count = now, 0
	}
	used := float64(h.count)
	if h.kind == "sliding" {
		left := float64(h.window-now.Sub(h.opened)) / float64(h.window)
		used = math.Round(float64(h.prev)*left + float64(h.count))
	}
	refuse := int(used)+1 > h.limit
	if !refuse || h.kind == "first request" {
		h.count++
	}
	remaining := max(h.limit-int(used)-1, 0)
	reset := h.opened.Add(h.window).Unix()
	if refuse {
		h.refused = append(h.refused, now.Sub(h.start))
	}
	h.mu.Unlock()
	w.Header().Set("X-RateLimit-Limit", strconv.Itoa(h.limit))
	w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	if refuse {
		if h.kind == "sliding" {
			w.Header().Set("Retry-After", strconv.Itoa(int(h.window.Seconds())))
		}
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	w.Write([]byte("ok"))
}

// A sequential client on a quota's window of each kind: the first reset
// does not say the kind, so the first grant after it is one attempt, late
// enough for the reset said in whole seconds to have come, and its answer
// tells a window whole again (fixed: the rest at once) from one that
// still counts the last (sliding: its rate, never the burst it refuses
// for a whole window). A window that opens with the first request opens
// with that grant, an interval after the reset: the next reset, counted on
// the old grid, comes that much early, once refused.
func TestLearnWindowKinds(t *testing.T) {
	for _, tc := range []struct {
		kind        string
		limit       int
		window      time.Duration
		pages       int
		most        time.Duration // to fetch them all
		mostRefused int
	}{
		// 20 at once, then 4 a second from the first reset: 5 + 1 + 30/4 s.
		{"sliding", 20, 5 * time.Second, 50, 14 * time.Second, 0},
		// 20 at once in each window: the third window's 10 start at 10 s.
		{"fixed", 20, 5 * time.Second, 50, 12 * time.Second, 0},
		// 10 a window of a second, opened by the first request: 4 windows,
		// and one refused at the grid's reset (no wait named: it is
		// asked again at the reset the refusal names).
		{"first request", 10, time.Second, 40, 5500 * time.Millisecond, 1},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				time.Sleep(437 * time.Millisecond) // the host's windows start within a second
				host := &windowHost{kind: tc.kind, limit: tc.limit, window: tc.window, start: time.Now()}
				net := newPipeNet(host)
				defer net.close()
				tr := New(WithBase(net.tr))
				start := time.Now()
				for page := range tc.pages {
					if code, _ := get(t, tr, fmt.Sprintf("http://window.test/?page=%d", page)); code != 200 {
						t.Fatalf("page %d: %d", page, code)
					}
				}
				took := time.Since(start)
				if took > tc.most || len(host.refused) > tc.mostRefused {
					t.Errorf("%d pages in %v, %d requests, refused at %v; want within %v, at most %d refused",
						tc.pages, took, host.hits, host.refused, tc.most, tc.mostRefused)
				}
			})
		})
	}
}

// A lone request refused with a wait named, after a quiet second, is the
// host spent for that wait by what came before: it is parked and retried
// after it, and no pace is learned from it (one attempt in a second says
// nothing of a rate). The host's next burst goes unpaced.
func TestLearnLoneRefusalNoCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits atomic.Int32
		host := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits.Add(1) == 6 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			w.Write([]byte("ok"))
		})
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr))
		for range 5 {
			get(t, tr, "http://lone.test/")
		}
		time.Sleep(2 * time.Second)
		start := time.Now()
		if code, _ := get(t, tr, "http://lone.test/"); code != 200 || time.Since(start) != time.Second {
			t.Fatalf("the refused request: %d after %v, want 200 after the 1 s named", code, time.Since(start))
		}
		if p, err := tr.HostPace(context.Background(), "lone.test"); err != nil || !p.Unlimited() {
			t.Errorf("HostPace after a lone refusal = %+v, %v; want unlimited", p, err)
		}
		start = time.Now()
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { get(t, tr, "http://lone.test/") })
		}
		wg.Wait()
		if took := time.Since(start); took > 0 {
			t.Errorf("20 requests after it took %v, want none held back", took)
		}
	})
}

// A window that opens with its first request, its last instant included
// (ulule/limiter's), refuses the attempt after a window's limit sent at
// exactly the rate it announces: that attempt falls on the instant the
// window ends. Seen to start anew, the window is paced a hair slower, so
// that only the opening is refused (the first burst, and the first
// reset, said in whole seconds while the window opened later), and a
// refused request does not meet that instant again and again (it did,
// one run in a few hundred, with 100 workers: a page handed back after
// its three tries). How the first tries go out (at once, or staggered)
// moves the opening; the steady state after it is what is asserted.
func TestLearnWindowRestarts(t *testing.T) {
	const opening = 3 * time.Second
	for _, tc := range []struct {
		workers, pages int
		most           time.Duration
	}{
		{1, 200, 22 * time.Second},
		{30, 200, 22 * time.Second},
		{100, 300, 32 * time.Second},
	} {
		t.Run(fmt.Sprintf("%d workers", tc.workers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				time.Sleep(437 * time.Millisecond)
				host := &windowHost{kind: "first request", limit: 10, window: time.Second, start: time.Now()}
				net := newPipeNet(host)
				defer net.close()
				tr := New(WithBase(net.tr))
				start := time.Now()
				failed := fetchPages(t, tr, "http://restarts.test/", tc.workers, tc.pages)
				took := time.Since(start)
				late := host.refusedSince(opening)
				// One late refusal may be the one that shows the window
				// starting anew, when the first tries went out staggered
				// and no restart was seen in the opening.
				if failed > 0 || len(late) > 1 || took > tc.most {
					t.Errorf("%d pages, %d failed, in %v, %d requests, refused after the first %v at %v; want none failed, at most one refused then, within %v",
						tc.pages, failed, took, host.hits, opening, late, tc.most)
				}
			})
		})
	}
}

// A sliding count (go-chi/httprate's) holds the same count at every
// attempt of a pace at its rate, and refuses them all or none by where
// they fall in its intervals: in the first half after its window opens,
// its rounded count reaches the limit. A lone refusal of a pace at the
// announced rate moves the pace half an interval, and keeps the rate:
// whatever the phase the run starts in, at most one refusal after the
// opening, where a cut brought the pace back to the same phase, refused
// again every few seconds (1.31 x the ideal behind httprate with 30
// workers and 50 ms).
func TestLearnSlidingPhase(t *testing.T) {
	const opening = 3 * time.Second
	for offset := time.Duration(0); offset < 100*time.Millisecond; offset += 10 * time.Millisecond {
		t.Run(offset.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &windowHost{kind: "sliding", limit: 10, window: time.Second, start: time.Now()}
				time.Sleep(437*time.Millisecond + offset)
				net := newPipeNet(host)
				defer net.close()
				tr := New(WithBase(net.tr))
				start := time.Now()
				failed := fetchPages(t, tr, "http://sliding.test/", 5, 200)
				took := time.Since(start)
				late := host.refusedSince(start.Sub(host.start) + opening)
				if failed > 0 || len(late) > 1 || took > 22*time.Second {
					t.Errorf("200 pages, %d failed, in %v, %d requests, refused after the first %v at %v (since the host's start); want none failed, at most one refused then, within 22s",
						failed, took, host.hits, opening, late)
				}
			})
		})
	}
}

// fetchPages fetches pages 1 to pages of url (?page=N) through rt with n
// workers, and returns how many did not end in a 200.
func fetchPages(t *testing.T, rt http.RoundTripper, url string, n, pages int) int64 {
	t.Helper()
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for p := next.Add(1); p <= int64(pages); p = next.Add(1) {
				if code, _ := get(t, rt, fmt.Sprintf("%s?page=%d", url, p)); code != 200 {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return failed.Load()
}

// refusedSince is when the host refused, from after (since its start) on.
func (h *windowHost) refusedSince(after time.Duration) []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var late []time.Duration
	for _, at := range h.refused {
		if at >= after {
			late = append(late, at)
		}
	}
	return late
}
