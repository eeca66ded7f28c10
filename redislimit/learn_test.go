package redislimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
	"golang.org/x/time/rate"
)

// What one process learns of a host, every process sharing the prefix
// knows: the pace a refusal set, and the one a quota announced; and a
// query (the Signal HostPace sends) answers with it.
func TestLearnedPaceShared(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	a, b := newLimiter(t, addr, prefix), newLimiter(t, addr, prefix)
	ctx := context.Background()
	query := retryhttp.Signal{Now: time.Now(), Reset: -1, Remaining: -1}
	if p, err := b.Learn(ctx, "refuses.test", query); err != nil || !p.Pace.Unlimited() {
		t.Fatalf("a host never heard of: %+v, %v; want unlimited", p, err)
	}
	st, err := a.Learn(ctx, "refuses.test", retryhttp.Signal{Now: time.Now(), Refused: true,
		Status: http.StatusTooManyRequests, Reset: -1, Remaining: -1, Sent: 21})
	cut := st.Pace
	if err != nil || cut.Unlimited() {
		t.Fatalf("Learn of a 429 = %+v, %v; want a pace", cut, err)
	}
	// 0.9 of what the host accepted: 21 sent, one refused.
	if got := float64(cut.Limit); got < 17.9 || got > 18.1 {
		t.Errorf("pace after the cut %.2f/s, want 18/s", got)
	}
	if p, err := b.Learn(ctx, "refuses.test", query); err != nil || p.Pace != cut {
		t.Errorf("the other Limiter's query: %+v, %v; want %+v", p, err, cut)
	}
	// The pace starts when the refused burst's second is over, for all.
	// A learned pace hands out slots 250 ms ahead at most, so that waiting
	// requests get a pace that grows: the slot a second away is asked for
	// again 750 ms from now.
	now := time.Now()
	res, err := b.Reserve(ctx, retryhttp.Attempt{Host: "refuses.test", Now: now})
	if err != nil || res.AskAgain.IsZero() {
		t.Fatalf("Reserve = %+v, %v; want AskAgain", res, err)
	}
	within(t, "ask again after the cut", res.AskAgain.Sub(now), 750*time.Millisecond, 50*time.Millisecond)

	st, err = a.Learn(ctx, "quota.test", retryhttp.Signal{Now: time.Now(), Limit: 100,
		Window: 10 * time.Second, Reset: -1, Remaining: -1})
	quota := st.Pace
	if err != nil || quota != (retryhttp.Pace{Limit: 10, Burst: 100}) {
		t.Errorf("Learn of a quota of 100 in 10s = %+v, %v; want 10/s, burst 100", quota, err)
	}
	if p, err := b.Learn(ctx, "quota.test", query); err != nil || p.Pace != quota {
		t.Errorf("the other Limiter's query: %+v, %v; want %+v", p, err, quota)
	}
}

// Three OS processes behind one egress, with no pace configured, against a
// host that serves 20 a second (a bucket of 5) and refuses the rest with a
// bare 429, no Retry-After nor rate-limit headers:
// sharing what they learn, together they converge to about 20/s, where
// each learning alone would not see the others' load.
func TestProcessesLearnTogether(t *testing.T) {
	addr := redistest.Addr(t)
	const capacity = 20
	const runFor = 12 * time.Second
	for _, shared := range []bool{true, false} {
		name := "shared"
		if !shared {
			name = "in process"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var (
				mu       sync.Mutex
				ok, no   []time.Time
				capLimit = rate.NewLimiter(capacity, capacity/4)
			)
			host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if capLimit.AllowN(now, 1) {
					ok = append(ok, now)
					return
				}
				no = append(no, now)
				w.WriteHeader(http.StatusTooManyRequests)
			}))
			t.Cleanup(host.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			env := []string{envURL + "=" + host.URL + "/", envRedis + "=" + addr, envPrefix + "=" + testPrefix(t),
				envFor + "=" + runFor.String()}
			if !shared {
				env = append(env, envLocal+"=1")
			}
			start := time.Now()
			errs := make(chan error, 3)
			for range 3 {
				go func() { errs <- runHelper(ctx, "learn", env...) }()
			}
			for range 3 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			perSecond := func(ts []time.Time) []int {
				out := make([]int, int(runFor/time.Second)+2)
				for _, x := range ts {
					if i := int(x.Sub(start) / time.Second); i < len(out) {
						out[i]++
					}
				}
				return out
			}
			// The last 3 s of the run, once the processes have started.
			window := func(ts []time.Time) float64 {
				from, to := start.Add(runFor-3*time.Second), start.Add(runFor)
				n := 0
				for _, x := range ts {
					if !x.Before(from) && x.Before(to) {
						n++
					}
				}
				return float64(n) / 3
			}
			accepted, refused := window(ok), window(no)
			t.Logf("accepted per second %v", perSecond(ok))
			t.Logf("refused per second  %v", perSecond(no))
			t.Logf("last 3s: accepted %.1f/s, refused %.1f/s, sent %.1f/s (capacity %d/s)",
				accepted, refused, accepted+refused, capacity)
			if shared {
				if accepted < 0.5*capacity {
					t.Errorf("accepted %.1f/s, want near the capacity of %d/s", accepted, capacity)
				}
				if accepted+refused > 1.6*capacity {
					t.Errorf("sent %.1f/s, want near the capacity of %d/s, not a multiple", accepted+refused, capacity)
				}
			}
		})
	}
}
