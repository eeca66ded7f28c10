package retryhttp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The rate-limit lab of field note 002, replayed through the real Transport in
// synctest bubbles. Each host is an http.Handler on the bubble's clock.

// bucketHost is the price API: a token bucket of 5 at 1/s, then 429 with
// Retry-After in whole seconds.
type bucketHost struct {
	mu       sync.Mutex
	tokens   float64
	at       time.Time
	requests int
	refused  int
}

func (h *bucketHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The request takes its time after the answer is decided; a sleep under
	// the lock would stop the bubble's clock, as a mutex is not a durable block.
	defer time.Sleep(latency)
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if h.at.IsZero() {
		h.tokens, h.at = 5, now
	}
	h.tokens = min(5, h.tokens+now.Sub(h.at).Seconds())
	h.at = now
	h.requests++
	if h.tokens < 1-1e-9 {
		h.refused++
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(1-h.tokens))))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	h.tokens--
}

// latency is how long each request takes in the field note's lab.
const latency = 50 * time.Millisecond

func TestFieldNotesTwentyPages(t *testing.T) {
	tests := []struct {
		name         string
		opts         []Option
		wantRequests int
		wantRefused  int
		wantDone     time.Duration
	}{
		// Obeying Retry-After alone: the field note counted 34 requests, 14 refused.
		{"obey Retry-After", []Option{WithMaxAttempts(50), WithBudget(nil), WithLearning(false)}, 34, 14, 15700 * time.Millisecond},
		// Learning from the 429s (the default) on top of obeying them: the
		// pace falls to what the host grants, and fewer are refused.
		{"obey Retry-After, learning", []Option{WithMaxAttempts(50), WithBudget(nil)}, 24, 4, 15531921125},
		// Pacing below the limit: exactly 20, none refused, done by 18.9 s
		// (the 17 paced waits of 1/0.9 s, and the last request's 50 ms).
		{"paced 3 at 0.9/s", []Option{WithPace(0.9, 3)}, 20, 0, 18938888887},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &bucketHost{}
				net := newPipeNet(host)
				defer net.close()
				tr := New(append([]Option{WithBase(net.tr)}, tt.opts...)...)
				start := time.Now()
				for page := 1; page <= 20; page++ {
					if code, _ := get(t, tr, fmt.Sprintf("http://bazaar.test/api/v1/prices?page=%d", page)); code != 200 {
						t.Fatalf("page %d: %d", page, code)
					}
				}
				done := time.Since(start)
				if host.requests != tt.wantRequests || host.refused != tt.wantRefused || done != tt.wantDone {
					t.Errorf("%d requests, %d refused, done at %v; want %d, %d, %v",
						host.requests, host.refused, done, tt.wantRequests, tt.wantRefused, tt.wantDone)
				}
			})
		})
	}
}

// stockHost serves 5 requests in each whole second and answers the rest 503
// without Retry-After.
type stockHost struct {
	mu       sync.Mutex
	second   int64
	served   int
	requests int
	lastOK   time.Time
}

func (h *stockHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer time.Sleep(latency)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests++
	if sec := time.Now().Unix(); sec != h.second {
		h.second, h.served = sec, 0
	}
	if h.served >= 5 {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	h.served++
	h.lastOK = time.Now()
}

// Fifty collectors start together against the 5/s host, with the field note's
// backoff of base 2 s and cap 30 s. Waits of a fixed second, or doubling
// without jitter, come back in step and are refused again together (the
// field note counted 275 requests for each); full jitter spreads them and needs
// far fewer (the field note: 168).
func TestFieldNotesFiftyCollectors(t *testing.T) {
	for _, learning := range []bool{false, true} {
		results := map[string]int{}
		for _, tc := range []struct {
			name string
			opts func(rnd func() float64) []Option
		}{
			{"fixed 1 s", func(func() float64) []Option {
				return []Option{WithBackoff(time.Second, time.Second), fixedRand(0.9999999)}
			}},
			{"exponential, no jitter", func(func() float64) []Option {
				return []Option{WithBackoff(2*time.Second, 30*time.Second), fixedRand(0.9999999)}
			}},
			{"full jitter", func(rnd func() float64) []Option {
				return []Option{WithBackoff(2*time.Second, 30*time.Second), WithRand(rnd)}
			}},
		} {
			synctest.Test(t, func(t *testing.T) {
				host := &stockHost{}
				net := newPipeNet(host)
				defer net.close()
				var mu sync.Mutex
				src := rand.New(rand.NewPCG(1, 2))
				rnd := func() float64 { mu.Lock(); defer mu.Unlock(); return src.Float64() }
				opts := []Option{WithBase(net.tr), WithMaxAttempts(100), WithBudget(nil), WithLearning(learning)}
				tr := New(append(opts, tc.opts(rnd)...)...)
				var wg sync.WaitGroup
				for i := range 50 {
					wg.Go(func() {
						if code, _ := get(t, tr, fmt.Sprintf("http://flaky.test/stock?item=%d", i)); code != 200 {
							t.Errorf("collector %d: %d", i, code)
						}
					})
				}
				wg.Wait()
				results[tc.name] = host.requests
				served := host.lastOK.Sub(time.Unix(946684800, 0))
				t.Logf("learning %v, %s: %d requests, all served at %v", learning, tc.name, host.requests, served)
				// Learning the host's 5 a second makes the backoff's shape
				// matter little: every shape is paced to what it serves.
				if learning && (host.requests > 100 || served > 13*time.Second) {
					t.Errorf("learning, %s: %d requests, served at %v; want at most 100 by 13 s", tc.name, host.requests, served)
				}
			})
		}
		if j := results["full jitter"]; !learning && (j*10 > results["fixed 1 s"]*7 || j*10 > results["exponential, no jitter"]*7) {
			t.Errorf("requests: %v; full jitter should need far fewer than fixed or unjittered waits", results)
		}
	}
}
