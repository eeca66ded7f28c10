package redislimit_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// ringOf starts n private redis-servers and returns them, with a function
// that makes a Ring over them (one per process, as each would have its
// own), closed when the test ends.
func ringOf(t *testing.T, n int) ([]*redistest.Server, func() *redis.Ring) {
	t.Helper()
	srvs := make([]*redistest.Server, n)
	addrs := make(map[string]string, n)
	for i := range srvs {
		srvs[i] = redistest.StartT(t)
		addrs[string(rune('a'+i))] = srvs[i].Addr
	}
	return srvs, func() *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: addrs})
		t.Cleanup(func() { r.Close() })
		return r
	}
}

// holder returns the server of srvs that holds key, nil when none does.
func holder(t *testing.T, srvs []*redistest.Server, key string) *redistest.Server {
	t.Helper()
	for _, s := range srvs {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
		n, _ := rdb.Exists(context.Background(), key).Result()
		rdb.Close()
		if n == 1 {
			return s
		}
	}
	return nil
}

// A host parked on a Ring stays parked when the shard that holds the
// parking dies, and when it comes back empty: a process started after
// sends nothing to it.
func TestRingParkingOutlivesShard(t *testing.T) {
	for _, back := range []bool{false, true} {
		name := "shard dead"
		if back {
			name = "shard back empty"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srvs, ring := ringOf(t, 2)
			host := newFleetHost(t)
			prefix := testPrefix(t)
			const park, kill, restart, newcomer, total = time.Second, 1500 * time.Millisecond, 2500 * time.Millisecond, 3 * time.Second, 5 * time.Second
			var dead *redistest.Server
			members := []*member{{rdb: ring()}, {rdb: ring()}, {rdb: ring()}, {rdb: ring(), start: newcomer}}
			events := []event{
				{park, func() error { host.refuse.Store(30); return nil }},
				{kill, func() error {
					if dead = holder(t, srvs, prefix+hostOf(host.URL)); dead == nil {
						return errorf("no shard holds the parked host")
					}
					dead.Kill()
					return nil
				}},
			}
			if back {
				events = append(events, event{restart, func() error { return dead.Restart() }})
			}
			start := runFleet(t, host, prefix, total, members, events...)
			parked := host.parkedAt()
			if parked.IsZero() {
				t.Fatal("the host never answered its 429")
			}
			ts := host.served()
			after := between(ts, parked.Add(100*time.Millisecond), start.Add(total))
			t.Logf("per second: %s; %d requests after the 429 asked for 30 s", perSecond(ts, start, total), len(after))
			if len(after) > 0 {
				t.Errorf("%d requests reached a host parked for 30 s after its shard died (first at %v)",
					len(after), after[0].Sub(start).Round(time.Millisecond))
			}
		})
	}
}

// On a Ring, the shard of a paced host dying and coming back empty costs
// at most one burst above the pace: at once (go-redis's retries hide the
// restart), or after the Ring saw it down.
func TestRingShardBackEmpty(t *testing.T) {
	for _, down := range []time.Duration{0, 2 * time.Second} {
		t.Run("down "+down.String(), func(t *testing.T) {
			t.Parallel()
			// A run whose busiest second is over the bound is run once
			// more (runOnceMore): on the real clock, under -race and a
			// loaded machine, a run now and then holds 23-27 (the core of
			// 260931f too), where a fault of the limiter's misses every run.
			runOnceMore(t, func(try int, last bool) bool {
				srvs, ring := ringOf(t, 2)
				host := newFleetHost(t)
				prefix := testPrefix(t) + strconv.Itoa(try)
				const kill, total = 1500 * time.Millisecond, 5500 * time.Millisecond
				var dead *redistest.Server
				members := []*member{{rdb: ring()}, {rdb: ring()}, {rdb: ring()}}
				start := runFleet(t, host, prefix, total, members,
					event{kill, func() error {
						if dead = holder(t, srvs, prefix+hostOf(host.URL)); dead == nil {
							return errorf("no shard holds the host")
						}
						dead.Kill()
						return nil
					}},
					event{kill + down, func() error { return dead.Restart() }})
				ts := host.served()
				t.Logf("run %d: per second: %s", try, perSecond(ts, start, total))
				t.Logf("run %d: per 100ms from the kill: %v", try, histogram(between(ts, start.Add(kill), start.Add(total)), 100*time.Millisecond))
				if !last && overBusiest(ts, start, start, start.Add(total)) {
					return true
				}
				checkBusiest(t, "whole run", ts, start, start, start.Add(total))
				return false
			})
		})
	}
}

// Parkings are published on a Ring too: a parking set by one process
// reaches another's request waiting for its slot without a call to Redis.
func TestRingParkingPublished(t *testing.T) {
	t.Parallel()
	_, ring := ringOf(t, 2)
	counter := &scriptCounter{}
	rb := ring()
	// The Limiter calls the shard it places a host on, not the Ring.
	rb.ForEachShard(context.Background(), func(_ context.Context, c *redis.Client) error {
		c.AddHook(counter)
		return nil
	})
	b := newRingLimiter(t, rb)
	a := newRingLimiter(t, ring())
	checkParkingReachesWaiter(t, a, b)
	if n := counter.n.Load(); n != 2 {
		t.Errorf("%d calls to Redis by the waiting Limiter, want 2 (its two slots)", n)
	}
}
