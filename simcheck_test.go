package retryhttp

// The simulated hosts are the simulator's ground truth: a family's ideal is
// only as good as its host is what its comment says. These cases pin each
// host's answers at given instants of the bubble's clock.

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// simAnswerText is an answer as the cases write it: the status (or
// "refused"), and what it says of its wait and quota.
func simAnswerText(a simAnswer) string {
	if a.refused {
		return "refused"
	}
	s := strconv.Itoa(a.status)
	if h := simHeaderText(a.header); h != "" {
		s += " " + h
	}
	return s
}

func TestSimHosts(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var d []time.Duration
		for _, v := range n {
			d = append(d, time.Duration(v)*time.Millisecond)
		}
		return d
	}
	tests := []struct {
		name string
		mk   func() simHost
		at   []time.Duration // one request at each instant after the start, in turn
		// together, when set, sends that many requests at once instead and
		// wants their answers sorted.
		together int
		want     []string
	}{
		{
			name: "bucket: the burst, then a token a 1/rate; Retry-After rounds the wait up",
			mk: func() simHost {
				return &simBucketHost{simBucketCfg: simBucketCfg{rate1: 2, burst: 2, code: 429, retryAfter: true}}
			},
			at:   ms(0, 0, 0, 500, 600),
			want: []string{"200", "200", "429 Retry-After: 1", "200", "429 Retry-After: 1"},
		},
		{
			name: "bucket announcing its rate as a quota over a second",
			mk: func() simHost {
				return &simBucketHost{simBucketCfg: simBucketCfg{rate1: 2, burst: 2, code: 503, headers: simIETF}}
			},
			at: ms(0, 0, 0),
			want: []string{
				`200 Ratelimit-Policy: "sim";q=2;w=1; Ratelimit: "sim";r=1;t=0`,
				`200 Ratelimit-Policy: "sim";q=2;w=1; Ratelimit: "sim";r=0;t=1`,
				`503 Ratelimit-Policy: "sim";q=2;w=1; Ratelimit: "sim";r=0;t=1`,
			},
		},
		{
			name: "bucket whose rate goes from 1/s to 4/s at 2 s",
			mk: func() simHost {
				return &simBucketHost{simBucketCfg: simBucketCfg{rate1: 1, rate2: 4, change: 2 * time.Second, burst: 1, code: 429}}
			},
			at:   ms(0, 0, 2000, 2250, 2300),
			want: []string{"200", "429", "200", "200", "429"},
		},
		{
			name: "fixed window: its quota, then refused to its end, whole again after",
			mk: func() simHost {
				return &simWindowHost{simWindowCfg: simWindowCfg{kind: "fixed", limit: 2, window: time.Second, retryAfter: true, headers: simXRateEpoch}}
			},
			at: ms(0, 0, 500, 1000),
			want: []string{
				"200 X-Ratelimit-Limit: 2; X-Ratelimit-Remaining: 1; X-Ratelimit-Reset: 946684801",
				"200 X-Ratelimit-Limit: 2; X-Ratelimit-Remaining: 0; X-Ratelimit-Reset: 946684801",
				"429 Retry-After: 1; X-Ratelimit-Limit: 2; X-Ratelimit-Remaining: 0; X-Ratelimit-Reset: 946684801",
				"200 X-Ratelimit-Limit: 2; X-Ratelimit-Remaining: 1; X-Ratelimit-Reset: 946684802",
			},
		},
		{
			name: "weighted count: half the last window's 4 still count at its middle, and it rounds",
			mk: func() simHost {
				return &simWindowHost{simWindowCfg: simWindowCfg{kind: "weighted", limit: 4, window: time.Second, retryAfter: true}}
			},
			at:   ms(0, 0, 0, 0, 0, 1500, 1500, 1500),
			want: []string{"200", "200", "200", "200", "429 Retry-After: 1", "200", "200", "429 Retry-After: 1"},
		},
		{
			name: "log: exactly the last window's requests",
			mk: func() simHost {
				return &simWindowHost{simWindowCfg: simWindowCfg{kind: "log", limit: 2, window: time.Second, retryAfter: true}}
			},
			at:   ms(0, 500, 900, 1000),
			want: []string{"200", "200", "429 Retry-After: 1", "200"},
		},
		{
			name: "log counting its refusals: a client that keeps asking stays refused",
			mk: func() simHost {
				return &simWindowHost{simWindowCfg: simWindowCfg{kind: "log", limit: 2, window: time.Second, counting: true}}
			},
			at:   ms(0, 100, 900, 1050, 1800, 2100),
			want: []string{"200", "200", "429", "429", "429", "200"},
		},
		{
			name: "outage of 503s from 1 s to 2 s",
			mk: func() simHost {
				return &simOutageHost{start: time.Now(), from: time.Second, to: 2 * time.Second}
			},
			at:   ms(500, 1000, 1999, 2000),
			want: []string{"200", "503", "503", "200"},
		},
		{
			name: "outage of refused connections",
			mk: func() simHost {
				return &simOutageHost{start: time.Now(), from: time.Second, to: 2 * time.Second, refuse: true}
			},
			at:   ms(500, 1000, 2000),
			want: []string{"200", "refused", "200"},
		},
		{
			name: "one slot, no queue: the rest refused at once",
			mk: func() simHost {
				return &simSlotsHost{n: 1, service: 100 * time.Millisecond, timeout: time.Hour, code: 429, slots: make(chan struct{}, 1)}
			},
			together: 3,
			want:     []string{"200", "429", "429"},
		},
		{
			name: "one slot, a queue of one: the queued one is served, the one beyond refused",
			mk: func() simHost {
				return &simSlotsHost{n: 1, queue: 1, service: 100 * time.Millisecond, timeout: time.Second, code: 503, slots: make(chan struct{}, 1)}
			},
			together: 3,
			want:     []string{"200", "200", "503"},
		},
		{
			name: "one slot, a queue of one timing out before the slot frees",
			mk: func() simHost {
				return &simSlotsHost{n: 1, queue: 1, service: 100 * time.Millisecond, timeout: 50 * time.Millisecond, code: 503, slots: make(chan struct{}, 1)}
			},
			together: 3,
			want:     []string{"200", "503", "503"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				h := tt.mk()
				var got []string
				if tt.together > 0 {
					var mu sync.Mutex
					var wg sync.WaitGroup
					for range tt.together {
						wg.Go(func() {
							a := simAnswerText(h.serve(context.Background()))
							mu.Lock()
							got = append(got, a)
							mu.Unlock()
						})
					}
					wg.Wait()
					slices.Sort(got)
				}
				for _, at := range tt.at {
					time.Sleep(time.Until(start.Add(at)))
					got = append(got, simAnswerText(h.serve(context.Background())))
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("answers (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// The simulator's own figures: a draw's ideal is met by the client it
// describes. A client that sends a bucket's burst at once and then one
// request a 1/rate, or a window's limit at the start of each window, as
// the families' ideals say, gets every page in that time, never refused.
func TestSimIdealClient(t *testing.T) {
	tests := []struct {
		family string
		// at is when the ideal client sends page i to host h.
		at func(h simHost, i int) time.Duration
	}{
		{"bucket429", func(h simHost, i int) time.Duration {
			b := h.(*simBucketHost)
			// Rounded up: a token is whole only at its instant, not a
			// nanosecond before.
			return time.Duration(math.Ceil(float64(max(0, i-int(b.burst)+1)) / b.rate1 * float64(time.Second)))
		}},
		{"fixedWindow", func(h simHost, i int) time.Duration {
			w := h.(*simWindowHost)
			return time.Duration(i/w.limit) * w.window
		}},
		{"slidingWeighted", func(h simHost, i int) time.Duration {
			w := h.(*simWindowHost)
			return simWeightedAt(i, w.limit, w.window)
		}},
		{"slidingLog", func(h simHost, i int) time.Duration {
			w := h.(*simWindowHost)
			return time.Duration(i/w.limit) * w.window
		}},
	}
	for _, tt := range tests {
		i := slices.IndexFunc(simFamilies, func(f simFamily) bool { return f.name == tt.family })
		if i < 0 {
			t.Fatalf("no family %s", tt.family)
		}
		fam := simFamilies[i]
		for seed := range uint64(20) {
			d := fam.draw(newSimRand(fam.name, seed))
			synctest.Test(t, func(t *testing.T) {
				h := d.mk()
				start := time.Now()
				var refused atomic.Int64
				var wg sync.WaitGroup
				for i := range d.pages {
					wg.Go(func() {
						time.Sleep(time.Until(start.Add(tt.at(h, i))))
						if a := h.serve(context.Background()); a.status != http.StatusOK {
							refused.Add(1)
						}
					})
				}
				wg.Wait()
				// A nanosecond's rounding either way is not a miss.
				if took := time.Since(start); refused.Load() != 0 || took > d.ideal+time.Microsecond {
					t.Errorf("%s:%d %s: the ideal client was refused %d times in %v, ideal %v", fam.name, seed, d.params, refused.Load(), took, d.ideal)
				}
			})
		}
	}
}
