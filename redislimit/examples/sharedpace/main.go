// Command sharedpace shows what redislimit is for: several worker
// processes call one host, each with retryhttp pacing it at the same pace.
// With the in-process pacer each keeps to the pace on its own, so the host
// sees the pace times the number of workers; with the shared limiter they
// keep to it together.
//
//	go run ./examples/sharedpace                  # from redislimit/, Redis on 127.0.0.1:6379
//	go run ./examples/sharedpace -redis 127.0.0.1:6390 -workers 3 -pace 10 -for 3s
//
// The host is a stub on loopback that counts what it gets. The workers are
// this same program, started again with SHAREDPACE_WORKER set. The shared
// run needs a Redis; without one the program says so after the first run
// and exits with status 1.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"golang.org/x/time/rate"
)

// The worker's orders, passed in its environment.
const (
	envWorker = "SHAREDPACE_WORKER" // the worker's number; set only in workers
	envURL    = "SHAREDPACE_URL"
	envMode   = "SHAREDPACE_MODE" // "local" or "redis"
	envRedis  = "SHAREDPACE_REDIS"
	envPrefix = "SHAREDPACE_PREFIX"
	envPace   = "SHAREDPACE_PACE"
	envFor    = "SHAREDPACE_FOR"
	envStart  = "SHAREDPACE_START" // Unix nanoseconds: when all workers begin
	envTime   = "SHAREDPACE_TIMEOUT"
)

// startDelay is how long the workers are given to start before they all
// begin at once, so that each run has them all at work together.
const startDelay = 1500 * time.Millisecond

func main() {
	if os.Getenv(envWorker) != "" {
		if err := worker(); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		return
	}
	var c config
	defRedis := "127.0.0.1:6379"
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		defRedis = a
	}
	flag.StringVar(&c.redis, "redis", defRedis, "Redis address for the shared run (default $REDIS_ADDR, else 127.0.0.1:6379)")
	flag.IntVar(&c.workers, "workers", 3, "worker processes")
	flag.Float64Var(&c.pace, "pace", 10, "pace of each worker's Transport, requests a second to the host")
	flag.DurationVar(&c.dur, "for", 3*time.Second, "length of each run")
	flag.DurationVar(&c.timeout, "redis-timeout", redislimit.DefaultTimeout, "bound on each call to Redis")
	flag.Parse()
	if _, err := run(context.Background(), c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sharedpace:", err)
		os.Exit(1)
	}
}

type config struct {
	redis   string
	workers int
	pace    float64
	dur     time.Duration
	timeout time.Duration // redislimit.WithTimeout
}

// result is what the host saw in one run.
type result struct {
	name      string
	requests  int
	rate      float64 // combined, requests a second
	perWorker []int
}

// errNoRedis is returned when the shared run cannot be made.
var errNoRedis = errors.New("no Redis reachable")

// run makes the two runs, in-process pacers and then the shared limiter,
// and writes what the host saw to out.
func run(ctx context.Context, c config, out io.Writer) ([]result, error) {
	if c.workers < 1 || c.pace <= 0 || c.dur <= 0 {
		return nil, fmt.Errorf("need workers ≥ 1, pace > 0, for > 0")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "%d worker processes, each pacing the host at %g/s, %v per run\n\n", c.workers, c.pace, c.dur)
	var results []result
	local, err := runOnce(ctx, self, c, "local", "")
	if err != nil {
		return nil, err
	}
	local.name = "in-process pacers"
	results = append(results, local)

	if perr := ping(ctx, c.redis); perr != nil {
		report(out, c, results)
		fmt.Fprintf(out, "\nno Redis reachable at %s (%v): the shared run needs one.\n"+
			"Start one with: redis-server --port 6390 --save '' --appendonly no\n"+
			"and run again with -redis 127.0.0.1:6390.\n", c.redis, perr)
		return results, fmt.Errorf("%w at %s", errNoRedis, c.redis)
	}
	shared, err := runOnce(ctx, self, c, "redis", newPrefix())
	if err != nil {
		return nil, err
	}
	shared.name = "shared through Redis"
	results = append(results, shared)
	report(out, c, results)
	return results, nil
}

// ping checks that a Redis answers at addr, within a second.
func ping(ctx context.Context, addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	conn.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return rdb.Ping(ctx).Err()
}

// runOnce starts the stub host and the workers, waits for them, and
// returns what the host saw.
func runOnce(ctx context.Context, self string, c config, mode, prefix string) (result, error) {
	var (
		mu    sync.Mutex
		times []time.Time
		by    = make([]int, c.workers)
	)
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		n, _ := strconv.Atoi(r.Header.Get("X-Worker"))
		mu.Lock()
		times = append(times, now)
		if n >= 0 && n < len(by) {
			by[n]++
		}
		mu.Unlock()
		w.Write([]byte("ok"))
	}))
	defer host.Close()

	// A worker that hangs is killed: the run is bounded.
	wctx, cancel := context.WithTimeout(ctx, c.dur+30*time.Second)
	defer cancel()
	errs := make(chan error, c.workers)
	begin := time.Now().Add(startDelay)
	for i := range c.workers {
		cmd := exec.CommandContext(wctx, self, "-test.run=^$") // the flag matters only to a test binary
		cmd.Env = append(os.Environ(),
			envWorker+"="+strconv.Itoa(i), envURL+"="+host.URL, envMode+"="+mode,
			envRedis+"="+c.redis, envPrefix+"="+prefix,
			envPace+"="+strconv.FormatFloat(c.pace, 'g', -1, 64), envFor+"="+c.dur.String(),
			envStart+"="+strconv.FormatInt(begin.UnixNano(), 10), envTime+"="+c.timeout.String())
		go func() {
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = fmt.Errorf("worker %d: %v: %s", i, err, out)
			}
			errs <- err
		}()
	}
	var first error
	for range c.workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return result{}, first
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	r := result{requests: len(times), perWorker: append([]int(nil), by...)}
	if len(times) > 1 {
		r.rate = float64(len(times)-1) / times[len(times)-1].Sub(times[0]).Seconds()
	}
	return r, nil
}

func report(out io.Writer, c config, results []result) {
	fmt.Fprintf(out, "%-22s %8s %14s   %s\n", "run", "requests", "combined rate", "per worker")
	for _, r := range results {
		fmt.Fprintf(out, "%-22s %8d %12.1f/s   %v\n", r.name, r.requests, r.rate, r.perWorker)
	}
	fmt.Fprintf(out, "(each worker paces at %g/s: shared, the host should see %g/s in all)\n", c.pace, c.pace)
}

// worker sends requests to the host as fast as its pacer allows, from
// four goroutines, for the length of the run.
func worker() error {
	pace, err := strconv.ParseFloat(os.Getenv(envPace), 64)
	if err != nil {
		return err
	}
	dur, err := time.ParseDuration(os.Getenv(envFor))
	if err != nil {
		return err
	}
	begin, err := strconv.ParseInt(os.Getenv(envStart), 10, 64)
	if err != nil {
		return err
	}
	opts := []retryhttp.Option{retryhttp.WithPace(rate.Limit(pace), 1)}
	if os.Getenv(envMode) == "redis" {
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
		defer rdb.Close()
		timeout, _ := time.ParseDuration(os.Getenv(envTime)) // zero: the default
		l := redislimit.New(rdb, redislimit.WithPrefix(os.Getenv(envPrefix)), redislimit.WithTimeout(timeout))
		defer l.Close() // before rdb.Close: deferred calls run last first
		// Check finds a misconfigured Redis at start, and warms the
		// Limiter before the run: its scripts loaded and a connection
		// open, its first calls are not slower than the rest. A worker
		// started on a loaded machine otherwise paid both on its first
		// request, in the run's window.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := l.Check(cctx)
		cancel()
		if err != nil {
			return err // says "redislimit: ..." itself
		}
		opts = append(opts, retryhttp.WithLimiter(l))
	}
	client := retryhttp.NewClient(opts...)
	// All workers run over the same window, however long each took to
	// start.
	time.Sleep(time.Until(time.Unix(0, begin)))
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, begin).Add(dur))
	defer cancel()
	url, id := os.Getenv(envURL), os.Getenv(envWorker)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100_000 { // bounded, whatever the pace
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				req.Header.Set("X-Worker", id)
				resp, err := client.Do(req)
				if err != nil {
					return // the run is over: the next slot comes after it
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	return nil
}

// newPrefix gives each run keys of its own, so that two runs at once, or a
// run and a test, do not share a pace by accident.
func newPrefix() string {
	var b [4]byte
	rand.Read(b[:])
	return "sharedpace:" + hex.EncodeToString(b[:]) + ":"
}
