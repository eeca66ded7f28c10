package redislimit_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

var (
	evalshaStat = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)`)
	netStat     = regexp.MustCompile(`total_net_(input|output)_bytes:(\d+)`)
)

// serverCost is what the server counted since its last CONFIG RESETSTAT:
// every command, EVALSHA calls and their time, and bytes in and out.
type serverCost struct {
	commands, evalsha int
	usec              int
	in, out           int
}

var cmdCalls = regexp.MustCompile(`cmdstat_[a-z|]+:calls=(\d+)`)

func readCost(t *testing.T, admin *redis.Client) serverCost {
	t.Helper()
	ctx := context.Background()
	cs, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	st, err := admin.Info(ctx, "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var c serverCost
	for _, m := range cmdCalls.FindAllStringSubmatch(cs, -1) {
		n, _ := strconv.Atoi(m[1])
		c.commands += n
	}
	if m := evalshaStat.FindStringSubmatch(cs); m != nil {
		c.evalsha, _ = strconv.Atoi(m[1])
		c.usec, _ = strconv.Atoi(m[2])
	}
	for _, m := range netStat.FindAllStringSubmatch(st, -1) {
		n, _ := strconv.Atoi(m[2])
		if m[1] == "input" {
			c.in = n
		} else {
			c.out = n
		}
	}
	return c
}

// TestReserveServerCost measures what one Reserve costs Redis, with INFO
// commandstats and INFO stats on a server of its own: commands, bytes
// and server time per Reserve, for a paced host and for an unpaced one
// that needs nothing; and the allocations of a Reserve in the process.
func TestReserveServerCost(t *testing.T) {
	srv := redistest.StartT(t)
	admin := newClient(t, srv.Addr)
	ctx := context.Background()
	l := redislimit.New(newClient(t, srv.Addr), redislimit.WithPrefix(testPrefix(t)), redislimit.WithTimeout(testTimeout))
	t.Cleanup(func() { l.Close() })
	for _, c := range []struct {
		name string
		pace retryhttp.Pace
		most float64       // EVALSHA per Reserve, at most
		gap  time.Duration // between Reserves
	}{
		{"paced", fastPace, 1.01, 0},
		// Spread over about 1.5 s: the refresh every 250 ms shows.
		{"unpaced", retryhttp.Pace{}, 0.01, 750 * time.Microsecond},
	} {
		host := c.name + ".cost.test"
		reserve := func() {
			res, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: c.pace, Now: time.Now()})
			if err != nil || !res.OK {
				t.Fatalf("Reserve = %+v, %v", res, err)
			}
		}
		reserve() // the scripts loaded, the connection made
		time.Sleep(100 * time.Millisecond)
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		before := readCost(t, admin) // the INFO calls themselves count
		const n = 2000
		start := time.Now()
		for range n {
			reserve()
			if c.gap > 0 {
				time.Sleep(c.gap)
			}
		}
		took := time.Since(start)
		after := readCost(t, admin)
		cmds := after.commands - before.commands - 2 // the two INFO of readCost
		perCall := 0.0
		if after.evalsha > 0 {
			perCall = float64(after.usec) / float64(after.evalsha)
		}
		t.Logf("%s: %d Reserves in %v (%.1f EVALSHA a second): %.3f commands, %.3f EVALSHA, %.0f bytes in and %.0f out, %.2f µs of server time per Reserve (%.1f µs per EVALSHA)",
			c.name, n, took.Round(time.Millisecond), float64(after.evalsha)/took.Seconds(), float64(cmds)/n, float64(after.evalsha)/n,
			float64(after.in-before.in)/n, float64(after.out-before.out)/n, float64(after.usec)/n, perCall)
		if got := float64(after.evalsha) / n; got > c.most {
			t.Errorf("%s: %.3f EVALSHA per Reserve, want at most %.2f", c.name, got, c.most)
		}
		allocs := testing.AllocsPerRun(200, reserve)
		t.Logf("%s: %.0f allocations per Reserve", c.name, allocs)
	}
	if l.Fallback() {
		t.Error("the limiter fell back")
	}
}
