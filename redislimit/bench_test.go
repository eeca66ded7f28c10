package redislimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
	"golang.org/x/time/rate"
)

// A pace no benchmark reaches: every Reserve takes a slot at once, so what
// is measured is the cost of asking.
var fastPace = retryhttp.Pace{Limit: 1e6, Burst: 1_000_000}

// benchLimiters are the Limiters compared: Redis through a plain client
// (each call runs aside on a goroutine, bounded by the Limiter's timeout),
// Redis through a client with ContextTimeoutEnabled (called directly), and
// the in-process pacer alone (what the Limiter falls back to).
func benchLimiters(b *testing.B) map[string]*redislimit.Limiter {
	addr := redistest.Addr(b)
	ctxAware := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { ctxAware.Close() })
	ls := map[string]*redislimit.Limiter{
		"redis":                       redislimit.New(newClient(b, addr), redislimit.WithPrefix(testPrefix(b))),
		"redis-ContextTimeoutEnabled": redislimit.New(ctxAware, redislimit.WithPrefix(testPrefix(b))),
		"inprocess":                   redislimit.New(nil),
	}
	for _, l := range ls {
		b.Cleanup(func() { l.Close() })
	}
	return ls
}

// BenchmarkReserve is the cost of one Reserve: one EVALSHA round trip to
// the loopback Redis, or the in-process pacer.
func BenchmarkReserve(b *testing.B) {
	for _, name := range []string{"redis", "redis-ContextTimeoutEnabled", "inprocess"} {
		b.Run(name, func(b *testing.B) {
			l := benchLimiters(b)[name]
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				res, err := l.Reserve(ctx, retryhttp.Attempt{Host: "bench.test", Pace: fastPace, Now: time.Now()})
				if err != nil || !res.OK {
					b.Fatalf("Reserve = %+v, %v", res, err)
				}
			}
			if l.Fallback() && name != "inprocess" {
				b.Fatal("the Limiter fell back: Redis failed during the benchmark")
			}
		})
	}
}

// BenchmarkReserveUnpacedSlowRedis is a Reserve for an unpaced host that
// needs nothing (no parking, no pace, no down mark), with every command to
// Redis 50-200 ms away (issue 27): after the first, which asks Redis, a
// Reserve waits on no round trip; it reads what a refresh off the request's
// path keeps. ns/op is the Reserve's own cost, far below one round trip.
func BenchmarkReserveUnpacedSlowRedis(b *testing.B) {
	proxy := redistest.StartProxy(b, redistest.Addr(b))
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	b.Cleanup(func() { rdb.Close() })
	l := redislimit.New(rdb, redislimit.WithPrefix(testPrefix(b)), redislimit.WithTimeout(500*time.Millisecond))
	b.Cleanup(func() { l.Close() })
	ctx := context.Background()
	if err := l.Check(ctx); err != nil {
		b.Fatal(err)
	}
	proxy.SetLatency(50*time.Millisecond, 200*time.Millisecond)
	unpaced := retryhttp.Attempt{Host: "unpaced.test", Pace: retryhttp.Pace{Limit: rate.Inf}}
	unpaced.Now = time.Now()
	if res, err := l.Reserve(ctx, unpaced); err != nil || !res.OK {
		b.Fatalf("first Reserve = %+v, %v", res, err)
	}
	b.ReportAllocs()
	var slowest time.Duration
	for b.Loop() {
		unpaced.Now = time.Now()
		res, err := l.Reserve(ctx, unpaced)
		if err != nil || !res.OK {
			b.Fatalf("Reserve = %+v, %v", res, err)
		}
		slowest = max(slowest, time.Since(unpaced.Now))
	}
	b.ReportMetric(float64(slowest.Microseconds()), "slowest-µs")
	if slowest >= 50*time.Millisecond {
		b.Fatalf("a Reserve took %v with Redis 50-200 ms away: it waited on Redis", slowest)
	}
	if l.Fallback() {
		b.Fatal("the Limiter fell back")
	}
}

// BenchmarkReserveParallel is Reserve from many goroutines at once, on one
// host: Redis pipelines nothing here, each call is its own round trip.
func BenchmarkReserveParallel(b *testing.B) {
	for _, name := range []string{"redis", "inprocess"} {
		b.Run(name, func(b *testing.B) {
			l := benchLimiters(b)[name]
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Reserve(ctx, retryhttp.Attempt{Host: "bench.test", Pace: fastPace, Now: time.Now()}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkTransport is a whole GET against a loopback httptest server:
// the bare pooled transport, retryhttp with its own in-process pacer, and
// retryhttp with the Redis limiter. The difference to "bare" is what each
// adds per request.
func BenchmarkTransport(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	b.Cleanup(srv.Close)
	lims := benchLimiters(b)
	clients := []struct {
		name string
		rt   http.RoundTripper
	}{
		{"bare", cleanhttp.DefaultPooledTransport()},
		{"retryhttp-inprocess", retryhttp.New(retryhttp.WithPace(fastPace.Limit, fastPace.Burst))},
		{"retryhttp-redislimit", retryhttp.New(retryhttp.WithLimiter(lims["redis"]),
			retryhttp.WithPace(fastPace.Limit, fastPace.Burst))},
		{"retryhttp-redislimit-ContextTimeoutEnabled", retryhttp.New(retryhttp.WithLimiter(lims["redis-ContextTimeoutEnabled"]),
			retryhttp.WithPace(fastPace.Limit, fastPace.Burst))},
	}
	for _, c := range clients {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: c.rt}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// BenchmarkGoRedisEvalSha is go-redis alone, the floor under a Reserve
// through Redis: a script taking two keys and 14 numbers and answering 13
// numbers the size of the reserve script's (µs of the server's clock), run
// with Script.Run and read with Int64Slice (as the Limiter did), and sent
// as an EVALSHA IntSliceCmd through Process (as it does now), both with a
// client with ContextTimeoutEnabled and the call's context bounded.
func BenchmarkGoRedisEvalSha(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	s := redis.NewScript(`local r = {} for i = 1, 13 do r[i] = 1764633600000000 + i end return r`)
	keys := []string{testPrefix(b) + "a", testPrefix(b) + "b"}
	nums := make([]int64, 14)
	for i := range nums {
		nums[i] = 1764633600000000 + int64(i)
	}
	if err := s.Run(context.Background(), rdb, keys, 0).Err(); err != nil {
		b.Fatal(err)
	}
	b.Run("Script.Run+Int64Slice", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := s.Run(ctx, rdb, keys, nums[0], nums[1], nums[2], nums[3], nums[4], nums[5], nums[6],
				nums[7], nums[8], nums[9], nums[10], nums[11], nums[12], nums[13]).Int64Slice()
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Process+IntSliceCmd", func(b *testing.B) {
		args := []any{"evalsha", s.Hash(), "2", keys[0], keys[1]}
		for i := range nums {
			args = append(args, &nums[i])
		}
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			cmd := redis.NewIntSliceCmd(ctx, args...)
			err := rdb.Process(ctx, cmd)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
