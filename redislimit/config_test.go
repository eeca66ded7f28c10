package redislimit_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// minimalACL is the README's minimal ACL for a Limiter with the default
// prefix: the commands its scripts run, the scripts themselves, the
// parking subscription, and INFO to read the eviction policy.
const minimalACL = "on >secret resetkeys ~retryhttp:* resetchannels &retryhttp:* -@all " +
	"+evalsha +eval +time +hmget +hget +hset +hdel +hgetall +pexpire +del +publish +subscribe +ping +info"

func aclSetUser(t *testing.T, admin *redis.Client, user, rules string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", user}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s: %v", user, err)
	}
}

var paced = retryhttp.Pace{Limit: 10, Burst: 1}

// Answers from Redis that waiting will not cure are errors, not an outage:
// the Limiter does not fall back, and Check finds them at start.
func TestRefusalsAreErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	admin := newClient(t, srv.Addr)
	ctx := context.Background()
	aclSetUser(t, admin, "notime", "on >pw ~* &* +@all -time")
	attempt := func(h string) retryhttp.Attempt {
		return retryhttp.Attempt{Host: h, Pace: paced, Now: time.Now()}
	}
	for _, c := range []struct {
		name string
		opts redis.Options
	}{
		{"no TIME", redis.Options{Username: "notime", Password: "pw"}},
		{"wrong password", redis.Options{Username: "notime", Password: "wrong"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.Addr = srv.Addr
			rdb := redis.NewClient(&opts)
			t.Cleanup(func() { rdb.Close() })
			// The test's timeout, not the default 50 ms: a first call
			// that took longer on a loaded machine fell back and returned
			// no error, where a refusal is refused however long it is.
			l := redislimit.New(rdb, redislimit.WithTimeout(testTimeout))
			t.Cleanup(func() { l.Close() })
			_, err := l.Reserve(ctx, attempt("a.test"))
			var rerr *redislimit.RefusedError
			if !errors.Is(err, redislimit.ErrRedisRefused) || !errors.As(err, &rerr) {
				t.Fatalf("Reserve: %v, want a *RefusedError", err)
			}
			t.Logf("Reserve: %v", err)
			if l.Fallback() {
				t.Errorf("a refusal switched the Limiter to pacing in process")
			}
			if err := l.Park(ctx, "a.test", time.Now().Add(time.Second)); !errors.Is(err, redislimit.ErrRedisRefused) {
				t.Errorf("Park: %v, want ErrRedisRefused", err)
			}
			if _, err := l.Learn(ctx, "a.test", retryhttp.Signal{Now: time.Now(), Refused: true, Status: 429, Reset: -1, Remaining: -1}); !errors.Is(err, redislimit.ErrRedisRefused) {
				t.Errorf("Learn: %v, want ErrRedisRefused", err)
			}
			if err := l.Check(ctx); !errors.Is(err, redislimit.ErrRedisRefused) {
				t.Errorf("Check: %v, want ErrRedisRefused", err)
			}
		})
	}
	t.Run("WRONGTYPE", func(t *testing.T) {
		l := redislimit.New(newClient(t, srv.Addr), redislimit.WithTimeout(testTimeout))
		t.Cleanup(func() { l.Close() })
		admin.Set(ctx, redislimit.DefaultPrefix+"string.test", "not a hash", 0)
		if _, err := l.Reserve(ctx, attempt("string.test")); !errors.Is(err, redislimit.ErrRedisRefused) {
			t.Errorf("Reserve on a key of another type: %v, want ErrRedisRefused", err)
		}
		if res, err := l.Reserve(ctx, attempt("fine.test")); err != nil || !res.OK {
			t.Errorf("Reserve on another host = %+v, %v; want a slot", res, err)
		}
		if l.Fallback() {
			t.Errorf("WRONGTYPE switched the Limiter to pacing in process")
		}
	})
}

// The README's minimal ACL is enough for everything the Limiter does:
// Check passes, and a parking set by one Limiter reaches a request another
// one holds a slot for, through the subscription.
func TestMinimalACL(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	aclSetUser(t, newClient(t, srv.Addr), "limiter", minimalACL)
	mk := func() *redislimit.Limiter {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "secret"})
		t.Cleanup(func() { rdb.Close() })
		// The test's timeout, not the default 50 ms: on a loaded machine
		// a call can take longer, and a fallback is not what this test
		// is about (a missing permission is refused however long the
		// timeout).
		l := redislimit.New(rdb, redislimit.WithTimeout(testTimeout))
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := mk(), mk()
	ctx := context.Background()
	if err := a.Check(ctx); err != nil {
		t.Fatalf("Check with the minimal ACL: %v", err)
	}
	checkParkingReachesWaiter(t, a, b)
	if _, err := a.Learn(ctx, "learn.test", retryhttp.Signal{Now: time.Now(), Limit: 100, Window: 10 * time.Second, Reset: -1, Remaining: -1}); err != nil {
		t.Errorf("Learn: %v", err)
	}
	if a.Fallback() || b.Fallback() {
		t.Errorf("a Limiter fell back under the minimal ACL")
	}
}

// checkParkingReachesWaiter: b holds a slot in the future; a parks the
// host; b's check after its wait sees the parking without asking Redis.
func checkParkingReachesWaiter(t *testing.T, a, b *redislimit.Limiter) {
	t.Helper()
	ctx := context.Background()
	const h = "waiter.test"
	p := retryhttp.Pace{Limit: 5, Burst: 1}
	for i := range 2 {
		res, err := b.Reserve(ctx, retryhttp.Attempt{Host: h, Pace: p, Now: time.Now()})
		if err != nil || !res.OK {
			t.Fatalf("Reserve %d = %+v, %v", i, res, err)
		}
	}
	// The listener starts with the first answer: wait for it to have
	// subscribed, and then for the parking to come through it (fixed
	// sleeps of 100 and 50 ms were short now and then under -race on a
	// loaded machine, and the check then went to Redis). A parking that
	// is not published never comes, however long the wait.
	waitFor(t, "the waiting Limiter's subscription", 5*time.Second, b.Subscribed)
	if err := a.Park(ctx, h, time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the parking through the subscription", 1500*time.Millisecond, func() bool { return b.ParkingHeard(h) })
	res, err := b.Reserve(ctx, retryhttp.Attempt{Host: h, Pace: retryhttp.Pace{}, Now: time.Now(), CheckOnly: true})
	if err != nil || res.ParkedUntil.IsZero() {
		t.Errorf("check after the wait = %+v, %v; want the parking another Limiter set", res, err)
	}
}

// A Redis that may evict the Limiter's keys is reported by Check and
// logged once the Limiter first reaches it. Every key of the Limiter has a
// TTL, so volatile-* policies are as unsafe as allkeys-*.
func TestEvictionPolicyDetected(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-ttl", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartT(t, "--maxmemory", "64mb", "--maxmemory-policy", policy)
			log := newLogCounter()
			l := redislimit.New(newClient(t, srv.Addr), redislimit.WithLogger(slog.New(log)))
			t.Cleanup(func() { l.Close() })
			err := l.Check(context.Background())
			bad := policy != "noeviction"
			if bad {
				var cerr *redislimit.ConfigError
				if !errors.Is(err, redislimit.ErrEvictionPolicy) || !errors.As(err, &cerr) || cerr.Value != policy {
					t.Fatalf("Check: %v, want a *ConfigError for %s", err, policy)
				}
				t.Logf("Check: %v", err)
			} else if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if _, err := l.Reserve(context.Background(), retryhttp.Attempt{Host: "a.test", Pace: paced, Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			for bad && log.count(slog.LevelWarn) == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			if got, want := log.count(slog.LevelWarn), map[bool]int{true: 1, false: 0}[bad]; got != want {
				t.Errorf("%d warnings, want %d: %q", got, want, log.msgs)
			}
		})
	}
}
