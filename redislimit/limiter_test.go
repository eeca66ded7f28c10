package redislimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

const host = "api.example.test"

func reserve(t *testing.T, l *redislimit.Limiter, p retryhttp.Pace, now, latest time.Time) retryhttp.Reservation {
	t.Helper()
	res, err := l.Reserve(context.Background(), retryhttp.Attempt{Host: host, Pace: p, Now: now, Latest: latest})
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	return res
}

// near fails t unless got is within [want-slack, want+2ms]: a wait counted
// on Redis's clock gets the time of the round trip added.
func near(t *testing.T, what string, got, want, slack time.Duration) {
	t.Helper()
	// Above by up to 10 ms: a delay counted by Redis's clock, read a
	// round trip after the local one, comes out a little long under -race
	// on shared cores (102-105 ms for 100, at 260931f too).
	if got > want+10*time.Millisecond || got < want-slack {
		t.Errorf("%s = %v, want %v (within %v below)", what, got, want, slack)
	}
}

// within fails t unless got is within slack of want, either side.
func within(t *testing.T, what string, got, want, slack time.Duration) {
	t.Helper()
	if got > want+slack || got < want-slack {
		t.Errorf("%s = %v, want %v ± %v", what, got, want, slack)
	}
}

// Both implementations of the pacing rules, Redis and in process, must
// give the same answers.
func limiters(t *testing.T) map[string]func(t *testing.T) *redislimit.Limiter {
	return map[string]func(t *testing.T) *redislimit.Limiter{
		"redis": func(t *testing.T) *redislimit.Limiter {
			addr := redistest.Addr(t)
			l := newLimiter(t, addr, testPrefix(t))
			return l
		},
		"inprocess": func(t *testing.T) *redislimit.Limiter { return redislimit.New(nil) },
	}
}

func TestReserveBurstThenPace(t *testing.T) {
	for name, mk := range limiters(t) {
		t.Run(name, func(t *testing.T) {
			l := mk(t)
			p := retryhttp.Pace{Limit: 10, Burst: 3}
			var delays []time.Duration
			for range 5 {
				res := reserve(t, l, p, time.Now(), time.Time{})
				if !res.OK || !res.ParkedUntil.IsZero() {
					t.Fatalf("Reserve = %+v, want a slot", res)
				}
				delays = append(delays, res.Delay)
			}
			for i, want := range []time.Duration{0, 0, 0, 100 * time.Millisecond, 200 * time.Millisecond} {
				near(t, "delay", delays[i], want, 20*time.Millisecond)
			}
		})
	}
}

// Nothing is taken for a slot past the deadline. The pace is 1/s, and the
// delays are checked against the moment of the slot taken first, not
// against a fixed interval with a fixed slack: at 10/s with 20 ms of
// slack, a loaded machine under -race that took longer than that between
// two calls failed the test, where a slot taken past the deadline is a
// whole interval off.
func TestReserveTakesNothingPastLatest(t *testing.T) {
	for name, mk := range limiters(t) {
		t.Run(name, func(t *testing.T) {
			l := mk(t)
			p := retryhttp.Pace{Limit: 1, Burst: 1}
			from := time.Now()
			if res := reserve(t, l, p, from, from.Add(time.Second)); !res.OK || res.Delay != 0 {
				t.Fatalf("first Reserve = %+v, want a slot now", res)
			}
			to := time.Now() // the first slot lies in [from, to]
			now := time.Now()
			res := reserve(t, l, p, now, now.Add(500*time.Millisecond))
			if res.OK {
				t.Fatalf("Reserve with 500ms to spare = %+v, want OK false", res)
			}
			nearSlot(t, "refused delay", res.Delay, now, from, to, time.Second)
			// Nothing was taken: the next slot is still the one refused.
			now = time.Now()
			res = reserve(t, l, p, now, time.Time{})
			if !res.OK {
				t.Fatalf("Reserve without bound = %+v, want a slot", res)
			}
			nearSlot(t, "delay", res.Delay, now, from, to, time.Second)
			// A deadline already past admits nothing, not even a free slot.
			other := retryhttp.Attempt{Host: "other.test", Pace: p, Now: time.Now()}
			other.Latest = other.Now.Add(-time.Millisecond)
			if res, err := l.Reserve(context.Background(), other); err != nil || res.OK {
				t.Errorf("Reserve past its deadline = %+v, %v; want OK false", res, err)
			}
		})
	}
}

// nearSlot fails t unless got, the delay of a Reserve made at now, reaches
// the slot one interval after a slot taken between from and to: up to 10
// ms later, as near allows, for a delay counted by Redis's clock.
func nearSlot(t *testing.T, what string, got time.Duration, now, from, to time.Time, interval time.Duration) {
	t.Helper()
	lo, hi := from.Add(interval).Sub(now), to.Add(interval+10*time.Millisecond).Sub(now)
	if got < lo || got > hi {
		t.Errorf("%s = %v, want %v to %v (the slot %v after one taken between %v and %v before the call)",
			what, got, lo, hi, interval, now.Sub(from), now.Sub(to))
	}
}

func TestUnpacedHostIsNotPaced(t *testing.T) {
	for name, mk := range limiters(t) {
		t.Run(name, func(t *testing.T) {
			l := mk(t)
			for range 50 {
				res := reserve(t, l, retryhttp.Pace{Limit: 0}, time.Now(), time.Time{})
				if !res.OK || res.Delay != 0 {
					t.Fatalf("Reserve unpaced = %+v, want a slot now", res)
				}
			}
		})
	}
}

func TestParkHoldsAndNeverShortens(t *testing.T) {
	for name, mk := range limiters(t) {
		t.Run(name, func(t *testing.T) {
			l := mk(t)
			ctx := context.Background()
			now := time.Now()
			if err := l.Park(ctx, host, now.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := l.Park(ctx, host, now.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			for _, p := range []retryhttp.Pace{{Limit: 0}, {Limit: 10, Burst: 1}} {
				at := time.Now()
				res := reserve(t, l, p, at, time.Time{})
				if res.OK {
					t.Fatalf("Reserve on a parked host = %+v, want ParkedUntil", res)
				}
				near(t, "parked for", res.ParkedUntil.Sub(now), 2*time.Second, 50*time.Millisecond)
			}
			if err := l.Park(ctx, host, now.Add(3*time.Second)); err != nil {
				t.Fatal(err)
			}
			res := reserve(t, l, retryhttp.Pace{Limit: 10, Burst: 1}, time.Now(), time.Time{})
			near(t, "extended parking", res.ParkedUntil.Sub(now), 3*time.Second, 50*time.Millisecond)
		})
	}
}

// The parking lives in Redis: a Limiter on another connection, standing
// for another process, sees it, with its rest counted on Redis's clock.
func TestParkSharedThroughRedis(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	ctx := context.Background()
	a := newLimiter(t, addr, prefix)
	now := time.Now()
	if err := a.Park(ctx, host, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	for i, p := range []retryhttp.Pace{{Limit: 0}, {Limit: 10, Burst: 1}} {
		b := newLimiter(t, addr, prefix)
		// The other process's clock is an hour off: the answer is relative
		// to its own Now all the same.
		skewed := time.Now().Add(time.Hour)
		res := reserve(t, b, p, skewed, time.Time{})
		if res.OK {
			t.Fatalf("%d: Reserve on a host parked elsewhere = %+v, want ParkedUntil", i, res)
		}
		within(t, "rest of parking", res.ParkedUntil.Sub(skewed), 2*time.Second-time.Since(now), 20*time.Millisecond)
	}
	// An earlier moment does not shorten the parking, from any process.
	c := newLimiter(t, addr, prefix)
	if err := c.Park(ctx, host, time.Now().Add(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	d := newLimiter(t, addr, prefix)
	res := reserve(t, d, retryhttp.Pace{Limit: 10, Burst: 1}, time.Now(), time.Time{})
	within(t, "parking after an earlier Park", time.Until(res.ParkedUntil), 2*time.Second-time.Since(now), 20*time.Millisecond)
}

// Processes whose clocks disagree still share one pace: the slots are
// counted on Redis's clock.
func TestPaceIgnoresProcessClocks(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := testPrefix(t)
	p := retryhttp.Pace{Limit: 10, Burst: 1}
	early := newLimiter(t, addr, prefix)
	late := newLimiter(t, addr, prefix)
	if res := reserve(t, early, p, time.Now().Add(-time.Minute), time.Time{}); !res.OK || res.Delay != 0 {
		t.Fatalf("first Reserve = %+v, want a slot now", res)
	}
	res := reserve(t, late, p, time.Now().Add(time.Minute), time.Time{})
	near(t, "second slot, from a clock a minute ahead", res.Delay, 100*time.Millisecond, 20*time.Millisecond)
	res = reserve(t, early, p, time.Now().Add(-time.Minute), time.Time{})
	near(t, "third slot, from a clock a minute behind", res.Delay, 200*time.Millisecond, 20*time.Millisecond)
}

// Each host is one key, prefix + host, that expires when nothing in it
// matters: the bucket full, the parking over, and no claim of a process on
// a share of it. A process keeps its claim while it calls the host, gives
// it back soon after it stops, and idle hosts vanish from Redis.
func TestKeysExpire(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := newClient(t, addr)
	prefix := testPrefix(t)
	l := redislimit.New(rdb, redislimit.WithPrefix(prefix), redislimit.WithTimeout(testTimeout))
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	key := prefix + host

	reserve(t, l, retryhttp.Pace{Limit: 0}, time.Now(), time.Time{})
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Errorf("an unpaced, unparked host wrote a key")
	}
	p := retryhttp.Pace{Limit: 10, Burst: 2}
	reserve(t, l, p, time.Now(), time.Time{})
	reserve(t, l, p, time.Now(), time.Time{})
	// The bucket is full again in 200 ms, but the process's claim keeps
	// the key: it may yet be cut off from Redis and pacing its share.
	if ttl := rdb.PTTL(ctx, key).Val(); ttl < 29*time.Second {
		t.Errorf("TTL with a claim = %v, want the claim's %v", ttl, 30*time.Second)
	}
	// Not called again, the process gives its claim back.
	waitFor(t, "the claim given back", 2*time.Second, func() bool {
		ttl := rdb.PTTL(ctx, key).Val()
		return ttl < time.Second
	})
	if err := l.Park(ctx, host, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ttl := rdb.PTTL(ctx, key).Val()
	if ttl < 4900*time.Millisecond || ttl > 5001*time.Millisecond {
		t.Errorf("TTL after a parking of 5s = %v, want about 5s", ttl)
	}
	// Another host is another key, which expires on its own.
	other := prefix + "other.test"
	if _, err := l.Reserve(ctx, retryhttp.Attempt{Host: "other.test", Pace: p, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, other).Val() != 1 {
		t.Errorf("no key %q for another host", other)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl < 4800*time.Millisecond {
		t.Errorf("TTL of the parked host fell to %v", ttl)
	}
	waitFor(t, "the other host's key gone", 4*time.Second, func() bool { return rdb.Exists(ctx, other).Val() == 0 })
}

// waitFor polls cond every 20 ms until it holds, failing t after d.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Keys of different prefixes are different buckets.
func TestPrefixesDoNotShare(t *testing.T) {
	addr := redistest.Addr(t)
	p := retryhttp.Pace{Limit: 1, Burst: 1}
	a := newLimiter(t, addr, testPrefix(t))
	b := newLimiter(t, addr, testPrefix(t))
	for _, l := range []*redislimit.Limiter{a, b} {
		if res := reserve(t, l, p, time.Now(), time.Time{}); !res.OK || res.Delay != 0 {
			t.Errorf("Reserve = %+v, want a slot now", res)
		}
	}
}

// A caller whose context has ended gets its error, and the Limiter does
// not take it for a Redis failure.
func TestReserveCancelled(t *testing.T) {
	l := newLimiter(t, redistest.Addr(t), testPrefix(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Reserve(ctx, retryhttp.Attempt{Host: host, Pace: retryhttp.Pace{Limit: 10, Burst: 1}, Now: time.Now()})
	if err != context.Canceled {
		t.Errorf("Reserve with a cancelled context: %v, want context.Canceled", err)
	}
	if l.Fallback() {
		t.Errorf("a cancelled call switched the Limiter to its fallback")
	}
}

// A client that honours deadlines itself is called directly; the answers
// are the same.
func TestContextTimeoutClient(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l := redislimit.New(rdb, redislimit.WithPrefix(testPrefix(t)), redislimit.WithTimeout(testTimeout))
	p := retryhttp.Pace{Limit: 10, Burst: 1}
	reserve(t, l, p, time.Now(), time.Time{})
	res := reserve(t, l, p, time.Now(), time.Time{})
	near(t, "second slot", res.Delay, 100*time.Millisecond, 20*time.Millisecond)
}

func TestFallbackShare(t *testing.T) {
	l := redislimit.New(nil, redislimit.WithFallbackShare(2))
	p := retryhttp.Pace{Limit: 10, Burst: 4}
	var delays []time.Duration
	now := time.Now()
	for range 3 {
		delays = append(delays, reserve(t, l, p, now, time.Time{}).Delay)
	}
	// Half the pace, half the burst: 5/s with a burst of 2.
	want := []time.Duration{0, 0, 200 * time.Millisecond}
	for i := range want {
		if delays[i] != want[i] {
			t.Errorf("delays = %v, want %v", delays, want)
			break
		}
	}
	if !l.Fallback() {
		t.Errorf("a Limiter without Redis does not say it paces in process")
	}
}

// A request cancelled while it waits for its slot gives the slot back, when
// no later slot was taken; with later ones taken it keeps it, so that no one
// is let in before them.
func TestCancelGivesSlotBack(t *testing.T) {
	for name, mk := range limiters(t) {
		t.Run(name, func(t *testing.T) {
			l := mk(t)
			p := retryhttp.Pace{Limit: 10, Burst: 1}
			reserve(t, l, p, time.Now(), time.Time{})
			second := reserve(t, l, p, time.Now(), time.Time{})
			if second.Cancel == nil {
				t.Fatalf("a reservation in the future has no Cancel: %+v", second)
			}
			second.Cancel(time.Now())
			third := reserve(t, l, p, time.Now(), time.Time{})
			near(t, "slot after a cancelled one", third.Delay, 100*time.Millisecond, 20*time.Millisecond)
			fourth := reserve(t, l, p, time.Now(), time.Time{})
			third.Cancel(time.Now()) // the fourth slot is behind it: kept
			fifth := reserve(t, l, p, time.Now(), time.Time{})
			near(t, "fourth slot", fourth.Delay, 200*time.Millisecond, 20*time.Millisecond)
			near(t, "slot after a cancel with others behind", fifth.Delay, 300*time.Millisecond, 20*time.Millisecond)
		})
	}
}
