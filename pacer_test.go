package retryhttp

import (
	"context"
	"errors"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/time/rate"
)

// The PoliteClient sample tests of the seed's rate-limit lesson, replayed
// through the real Transport: a host whose answers are scripted, and the
// moment each request reached it.
func TestPoliteClientSamples(t *testing.T) {
	type fetch struct {
		path  string
		after time.Duration // idle time before this fetch
	}
	tests := []struct {
		name    string
		scripts map[string][]step
		opts    []Option
		fetches []fetch
		want    []float64
	}{
		{
			name:    "a burst then the rate",
			opts:    []Option{WithPace(1, 2)},
			fetches: []fetch{{path: "/p0"}, {path: "/p1"}, {path: "/p2"}, {path: "/p3"}, {path: "/p4"}},
			want:    []float64{0, 0, 1, 2, 3},
		},
		{
			name:    "the bucket refills while idle, up to the burst",
			opts:    []Option{WithPace(0.5, 2)},
			fetches: []fetch{{path: "/a"}, {path: "/b"}, {path: "/c", after: 100 * time.Second}, {path: "/d"}, {path: "/e"}},
			want:    []float64{0, 0, 100, 100, 102},
		},
		{
			name:    "half a token is not a token",
			opts:    []Option{WithPace(0.5, 2)},
			fetches: []fetch{{path: "/a"}, {path: "/b"}, {path: "/c", after: time.Second}, {path: "/d"}},
			want:    []float64{0, 0, 2, 4},
		},
		{
			name:    "Retry-After is obeyed",
			scripts: map[string][]step{"/x": {{status: 429, headers: map[string]string{"Retry-After": "5"}}, {status: 200}}},
			opts:    []Option{WithPace(1, 2)},
			fetches: []fetch{{path: "/x"}},
			want:    []float64{0, 5},
		},
		{
			name:    "retries are paced too",
			scripts: map[string][]step{"/y": {{status: 503}, {status: 503}, {status: 200}}},
			opts:    []Option{WithPace(0.25, 1), WithBackoff(time.Second, time.Second), fixedRand(0.999)},
			fetches: []fetch{{path: "/y"}},
			want:    []float64{0, 4, 8},
		},
		{
			name:    "final answers are not retried",
			scripts: map[string][]step{"/gone": {{status: 404}}, "/no": {{status: 403}}},
			fetches: []fetch{{path: "/gone"}, {path: "/no"}},
			want:    []float64{0, 0},
		},
		{
			name:    "tries cap the retries",
			scripts: map[string][]step{"/z": {{status: 503}}},
			// Learning off: two 503s in a row would pace the host too.
			opts:    []Option{WithBackoff(time.Second, time.Second), fixedRand(0.5), WithLearning(false)},
			fetches: []fetch{{path: "/z"}},
			want:    []float64{0, 0.5, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(tt.scripts)
				net := newPipeNet(host)
				defer net.close()
				tr := New(append([]Option{WithBase(net.tr)}, tt.opts...)...)
				for _, f := range tt.fetches {
					time.Sleep(f.after)
					get(t, tr, "http://shop.test"+f.path)
				}
				if diff := cmp.Diff(tt.want, host.seconds()); diff != "" {
					t.Errorf("request times (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A Retry-After parks the host for every request through the Transport: a
// request to it waits out the parking when that fits the max wait and its
// context, fails fast with ErrHostPaused when it does not, and requests to
// other hosts are never held.
func TestParking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{
			"/busy":  {{status: 503, headers: map[string]string{"Retry-After": "30"}}, {status: 200}},
			"/gone":  {{status: 503, headers: map[string]string{"Retry-After": "120"}}},
			"/other": {{status: 200}},
			"/c":     {{status: 503, headers: map[string]string{"Retry-After": "30"}}},
		})
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr), WithMaxAttempts(1))
		start := time.Now()

		// One answer of 30 s parks a.test; b.test is not held.
		if code, _ := get(t, tr, "http://a.test/busy"); code != 503 {
			t.Fatalf("first answer: %d, want 503 (one try only)", code)
		}
		get(t, tr, "http://b.test/other")
		if got := time.Since(start); got != 0 {
			t.Errorf("b.test waited %v for a.test's parking", got)
		}
		// The next request to a.test waits the 30 s out, then goes.
		get(t, tr, "http://a.test/busy")
		if got := time.Since(start); got != 30*time.Second {
			t.Errorf("a.test request went at %v, want 30s", got)
		}

		// 120 s is beyond the max of 60 s: the next request fails at once.
		get(t, tr, "http://a.test/gone")
		parkedAt := time.Now()
		_, err := send(tr, "GET", "http://a.test/gone", "", nil)
		var pe *HostPausedError
		if !errors.Is(err, ErrHostPaused) || !errors.As(err, &pe) {
			t.Fatalf("request to a parked host: %v, want ErrHostPaused", err)
		}
		if diff := cmp.Diff(HostPausedError{Host: "a.test", Until: parkedAt.Add(120 * time.Second)}, *pe); diff != "" {
			t.Errorf("HostPausedError (-want +got):\n%s", diff)
		}
		if time.Since(parkedAt) != 0 {
			t.Errorf("a fast failure took %v", time.Since(parkedAt))
		}
		if !strings.Contains(err.Error(), "a.test") {
			t.Errorf("error %q does not name the host", err)
		}

		// A context that ends before the parking does fails fast too.
		get(t, tr, "http://c.test/c")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := sendCtx(ctx, tr, "GET", "http://c.test/c", "", nil); !errors.Is(err, ErrHostPaused) {
			t.Errorf("deadline shorter than the parking: %v, want ErrHostPaused", err)
		}
	})
}

// A response saying the quota is spent parks the host until the reset, in
// each of the header dialects.
func TestQuotaHeadersPark(t *testing.T) {
	tests := []struct {
		name    string
		headers func(now time.Time) map[string]string
		want    time.Duration
	}{
		{"GitHub epoch", func(now time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(now.Unix()+20, 10)}
		}, 20 * time.Second},
		{"GitHub delay", func(time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "7"}
		}, 7 * time.Second},
		{"draft RateLimit-Reset", func(time.Time) map[string]string {
			return map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "12"}
		}, 12 * time.Second},
		{"structured RateLimit", func(time.Time) map[string]string {
			return map[string]string{"RateLimit": `"default";r=0;t=15`}
		}, 15 * time.Second},
		{"quota left: no parking", func(time.Time) map[string]string {
			return map[string]string{"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "30"}
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				host := newStub(map[string][]step{"/q": {{status: 200, headers: tt.headers(start)}, {status: 200}}})
				net := newPipeNet(host)
				defer net.close()
				tr := New(WithBase(net.tr))
				get(t, tr, "http://api.test/q")
				get(t, tr, "http://api.test/q")
				if diff := cmp.Diff([]float64{0, tt.want.Seconds()}, host.seconds()); diff != "" {
					t.Errorf("request times (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A request waiting for its pace token when another request's answer parks
// the host waits out the parking too, then takes a fresh token.
func TestParkingWhileWaitingForToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/a": {{status: 429, headers: map[string]string{"Retry-After": "5"}}, {status: 200}}})
		net := newPipeNet(host)
		defer net.close()
		// Learning off: the 429's Retry-After: 5 would also slow the pace.
		tr := New(WithBase(net.tr), WithPace(1, 1), WithLearning(false))
		var wg sync.WaitGroup
		wg.Go(func() { get(t, tr, "http://api.test/a") })
		time.Sleep(time.Millisecond)
		wg.Go(func() { get(t, tr, "http://api.test/b") })
		wg.Wait()
		// /a at 0, parked till 5; /b waited for a token at 1, then for the
		// parking; at 5 the two share the fresh tokens, one at 5, one at 6,
		// in whichever order the two goroutines wake.
		if diff := cmp.Diff([]float64{0, 5, 6}, host.seconds()); diff != "" {
			t.Errorf("request times (-want +got):\n%s", diff)
		}
	})
}

func TestHostKeys(t *testing.T) {
	tests := []struct{ url, want string }{
		{"https://API.Example.com:443/x", "api.example.com"},
		{"http://api.example.com:80/x", "api.example.com"},
		{"http://api.example.com:443/x", "api.example.com:443"},
		{"https://api.example.com:8443/x", "api.example.com:8443"},
		{"http://[::1]:80/", "[::1]"},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := hostKey(u); got != tt.want {
			t.Errorf("hostKey(%s) = %q, want %q", tt.url, got, tt.want)
		}
	}
	for _, opt := range []string{"API.example.com", "api.example.com:443", "https://api.example.com/"} {
		if got := normalizeHostOption(opt); got != "api.example.com" {
			t.Errorf("normalizeHostOption(%q) = %q", opt, got)
		}
	}
}

// WithHostPace overrides WithPace for its host only.
func TestHostPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(nil)
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr), WithPace(1, 1), WithHostPace("SLOW.test", 0.1, 1))
		start := time.Now()
		for range 3 {
			get(t, tr, "http://fast.test/")
		}
		if got := time.Since(start); got != 2*time.Second {
			t.Errorf("three requests at 1/s took %v, want 2s", got)
		}
		start = time.Now()
		for range 2 {
			get(t, tr, "http://slow.test/")
		}
		if got := time.Since(start); got != 10*time.Second {
			t.Errorf("two requests at 0.1/s took %v, want 10s", got)
		}
	})
}

// Bad pace arguments become documented safe values, never a hang.
func TestPaceArguments(t *testing.T) {
	tests := []struct {
		r     rate.Limit
		burst int
		want  Pace
	}{
		{0, 5, Pace{Limit: rate.Inf}},
		{-1, 5, Pace{Limit: rate.Inf}},
		{rate.Limit(math.NaN()), 5, Pace{Limit: rate.Inf}},
		{2, 0, Pace{Limit: 2, Burst: 1}},
		{2, -3, Pace{Limit: 2, Burst: 1}},
		{1e-9, 1, Pace{Limit: rate.Limit(1 / time.Hour.Seconds()), Burst: 1}},
	}
	for _, tt := range tests {
		if got := newPace(tt.r, tt.burst); got != tt.want {
			t.Errorf("newPace(%v, %d) = %+v, want %+v", tt.r, tt.burst, got, tt.want)
		}
	}
}

// A crawler over a million hosts must not keep a million entries: hosts
// whose bucket has refilled and whose parking is over are forgotten.
func TestPacerMemoryBounded(t *testing.T) {
	l := newLocalLimiter(realClock{})
	now := time.Unix(1_800_000_000, 0)
	pace := Pace{Limit: 10, Burst: 1}
	const hosts = 200_000
	for i := range hosts {
		host := "h" + strconv.Itoa(i) + ".test"
		if _, err := l.Reserve(context.Background(), Attempt{Host: host, Pace: pace, Now: now}); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			l.Park(context.Background(), host, now.Add(time.Second))
		}
		now = now.Add(time.Millisecond) // 1,000 new hosts a second, each idle after 100 ms
	}
	total := 0
	for i := range l.shards {
		total += len(l.shards[i].hosts)
	}
	// About 100 hosts are active at any moment; a shard keeps at most twice
	// what survived its last sweep, and never sweeps below minSweep.
	if limit := shardCount * 2 * minSweep; total > limit {
		t.Errorf("%d host entries after %d hosts, want at most %d", total, hosts, limit)
	}
}

// BenchmarkPacer measures the limiter alone over 10,000 hosts from parallel
// goroutines: unpaced (the default), and paced with room in every bucket.
func BenchmarkPacer(b *testing.B) {
	hosts := make([]string, 10_000)
	for i := range hosts {
		hosts[i] = "h" + strconv.Itoa(i) + ".test"
	}
	for _, bc := range []struct {
		name string
		pace Pace
	}{
		{"unpaced", Pace{Limit: rate.Inf}},
		{"paced", Pace{Limit: rate.Inf / 2, Burst: 1 << 20}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := newLocalLimiter(realClock{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					l.Reserve(context.Background(), Attempt{Host: hosts[i%len(hosts)], Pace: bc.pace, Now: time.Now()})
				}
			})
		})
	}
}
