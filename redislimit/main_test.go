package redislimit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
	"golang.org/x/time/rate"
)

// The test binary doubles as the worker processes of the multi-process
// tests: run with envHelper set, it does that job and exits.
const (
	envHelper = "REDISLIMIT_TEST_HELPER" // "hammer", "learn" or "park"
	envURL    = "REDISLIMIT_TEST_URL"
	envRedis  = "REDISLIMIT_TEST_REDIS"
	envPrefix = "REDISLIMIT_TEST_PREFIX"
	envPace   = "REDISLIMIT_TEST_PACE"
	envFor    = "REDISLIMIT_TEST_FOR"
	envRAMax  = "REDISLIMIT_TEST_RA_MAX"
	envLocal  = "REDISLIMIT_TEST_LOCAL"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		if err := helperMain(mode); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// go-redis logs each failed dial on its own; the outage tests make
	// plenty on purpose.
	redis.SetLogger(quietLogger{})
	code := m.Run()
	redistest.Cleanup()
	os.Exit(code)
}

// helperMain is a worker process: "hammer" sends requests as fast as the
// shared pace allows for a while; "park" sends one request that the stub
// answers with a Retry-After, which parks the host in Redis.
func helperMain(mode string) error {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	l := redislimit.New(rdb, redislimit.WithPrefix(os.Getenv(envPrefix)), redislimit.WithTimeout(testTimeout))
	switch mode {
	case "hammer":
		pace, err := strconv.ParseFloat(os.Getenv(envPace), 64)
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(os.Getenv(envFor))
		if err != nil {
			return err
		}
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(rate.Limit(pace), 1))
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		hammer(ctx, client, os.Getenv(envURL), 4)
		return nil
	case "learn":
		// No pace configured: the Transport learns the host's from its
		// refusals, through the shared Limiter, or in process with
		// REDISLIMIT_TEST_LOCAL set.
		d, err := time.ParseDuration(os.Getenv(envFor))
		if err != nil {
			return err
		}
		opts := []retryhttp.Option{retryhttp.WithLimiter(l)}
		if os.Getenv(envLocal) != "" {
			opts = nil
		}
		client := retryhttp.NewClient(opts...)
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		hammer(ctx, client, os.Getenv(envURL), 4)
		return l.Close()
	case "park":
		raMax, err := time.ParseDuration(os.Getenv(envRAMax))
		if err != nil {
			return err
		}
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithMaxAttempts(1),
			retryhttp.WithRetryAfterLimits(time.Second, raMax))
		resp, err := client.Get(os.Getenv(envURL))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			return fmt.Errorf("status %d, want 429", resp.StatusCode)
		}
		return nil
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

// runHelper runs the test binary as a helper process and returns its error
// with its output.
func runHelper(ctx context.Context, mode string, env ...string) error {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("helper %s: %v: %s", mode, err, out)
	}
	return nil
}

// hammer sends GETs to url from n goroutines until ctx ends, each as soon
// as the pace lets it, and returns the longest any one took. Loops are
// bounded: 10,000 requests a goroutine at most.
func hammer(ctx context.Context, client *http.Client, url string, n int) time.Duration {
	var (
		wg      sync.WaitGroup
		longest atomic.Int64
	)
	for range n {
		wg.Go(func() {
			for range 10_000 {
				if ctx.Err() != nil {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				start := time.Now()
				resp, err := client.Do(req)
				took := int64(time.Since(start))
				for cur := longest.Load(); took > cur && !longest.CompareAndSwap(cur, took); {
					cur = longest.Load()
				}
				if err == nil {
					resp.Body.Close()
				} else if errors.Is(err, context.DeadlineExceeded) {
					return // the next slot comes after the run
				}
			}
		})
	}
	wg.Wait()
	return time.Duration(longest.Load())
}

// stub is a host on loopback that records when each request arrived, by
// path. Paths starting with /429/N answer 429 with Retry-After: N.
type stub struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string][]time.Time
}

func newStub(t testing.TB) *stub {
	s := &stub{hits: make(map[string][]time.Time)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		s.mu.Lock()
		s.hits[r.URL.Path] = append(s.hits[r.URL.Path], now)
		s.mu.Unlock()
		if secs, ok := strings.CutPrefix(r.URL.Path, "/429/"); ok {
			w.Header().Set("Retry-After", secs)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *stub) times(path string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := append([]time.Time(nil), s.hits[path]...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return ts
}

// observedRate is the rate between the first request and the last: with a
// burst of 1 and demand above the pace, the pace itself.
func observedRate(ts []time.Time) float64 {
	if len(ts) < 2 {
		return 0
	}
	return float64(len(ts)-1) / ts[len(ts)-1].Sub(ts[0]).Seconds()
}

// checkRate fails t unless the requests in ts came at pace, within tol
// (0.05 for 5 %).
func checkRate(t *testing.T, ts []time.Time, pace, tol float64) {
	t.Helper()
	got := observedRate(ts)
	t.Logf("%d requests over %v: %.2f/s for a pace of %.0f/s (%+.1f%%)",
		len(ts), spanOf(ts).Round(time.Millisecond), got, pace, 100*(got-pace)/pace)
	if math.Abs(got-pace) > tol*pace {
		t.Errorf("rate %.2f/s, want %.0f/s within %.0f%%", got, pace, 100*tol)
	}
}

func spanOf(ts []time.Time) time.Duration {
	if len(ts) < 2 {
		return 0
	}
	return ts[len(ts)-1].Sub(ts[0])
}

// testTimeout bounds calls to Redis in the tests that are not about
// failures: a loaded machine can stall a loopback call past the default
// 50 ms, and a fallback there would be noise.
const testTimeout = 2 * time.Second

// newLimiter is a Limiter on its own connection to addr, with the test's
// own prefix unless opts say otherwise.
func newLimiter(t testing.TB, addr, prefix string, opts ...redislimit.Option) *redislimit.Limiter {
	opts = append([]redislimit.Option{redislimit.WithPrefix(prefix), redislimit.WithTimeout(testTimeout)}, opts...)
	return redislimit.New(newClient(t, addr), opts...)
}

// newClient connects to addr; the client is closed when the test ends.
func newClient(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// testPrefix is a key prefix of the test's own, so that tests sharing one
// Redis never see each other's keys.
func testPrefix(t testing.TB) string {
	var b [4]byte
	rand.Read(b[:])
	name := strings.NewReplacer("/", ":", " ", "_").Replace(t.Name())
	return "retryhttp-test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// logCounter is a slog.Handler that counts records by level.
type logCounter struct {
	mu     sync.Mutex
	counts map[slog.Level]int
	msgs   []string
}

func newLogCounter() *logCounter { return &logCounter{counts: make(map[slog.Level]int)} }

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[r.Level]++
	h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
	return nil
}
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }

func (h *logCounter) count(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[l]
}

// callCounter is a go-redis hook that counts the calls made and failed.
type callCounter struct{ calls, failed atomic.Int64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.calls.Add(1)
		if err != nil && !errors.Is(err, redis.Nil) {
			c.failed.Add(1)
		}
		return err
	}
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
