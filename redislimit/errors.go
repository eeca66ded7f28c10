package redislimit

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrClosed is returned by a Limiter's methods after Close.
	ErrClosed = errors.New("redislimit: limiter closed")
	// ErrRedisRefused is the errors.Is target for an answer from Redis
	// that waiting will not cure: a missing ACL permission (NOPERM, or a
	// script that may not run TIME), wrong credentials (WRONGPASS,
	// NOAUTH), a key of another type under the prefix (WRONGTYPE), an
	// unknown command. The Limiter returns it instead of pacing in process:
	// the fallback is for a Redis that is away, not for one that is
	// misconfigured. The detail is a *RefusedError.
	ErrRedisRefused = errors.New("redislimit: Redis refused the limiter")
	// ErrEvictionPolicy is the errors.Is target for a Redis that may evict
	// the Limiter's keys (maxmemory set with a policy other than
	// noeviction): a parking or a bucket could vanish while it matters.
	// Check reports it; the Limiter logs it once when it first reaches
	// Redis. The detail is a *ConfigError.
	ErrEvictionPolicy = errors.New("redislimit: Redis may evict live keys")
)

// RefusedError is an answer from Redis that waiting will not cure, to the
// script Op ("reserve", "park", "learn", "cancel", "check") on Key. It
// matches ErrRedisRefused and unwraps to Redis's error.
type RefusedError struct {
	Op  string
	Key string
	Err error
}

// Error says which call Redis refused, on which key, and why.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("redislimit: Redis refused the %s script on %q: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns ErrRedisRefused and Redis's own error.
func (e *RefusedError) Unwrap() []error { return []error{ErrRedisRefused, e.Err} }

// ConfigError is a Redis setting the Limiter cannot rely on: Setting has
// Value where the Limiter needs Want. It matches ErrEvictionPolicy for the
// eviction policy.
type ConfigError struct {
	Setting string
	Value   string
	Want    string
}

// Error names the setting, its value and what the Limiter needs.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("redislimit: Redis %s is %q; the limiter needs %s", e.Setting, e.Value, e.Want)
}

// Unwrap returns ErrEvictionPolicy.
func (e *ConfigError) Unwrap() error { return ErrEvictionPolicy }

// permanent reports whether err is an answer from Redis that waiting will
// not cure. Everything else (a refused or dropped connection, a timeout,
// a server loading, out of memory, read-only after a failover, a cluster
// resharding) is Redis being away for a while, and is paced around.
func permanent(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, redis.Nil) {
		return false
	}
	msg := rerr.Error()
	word, _, _ := strings.Cut(msg, " ")
	switch word {
	case "NOPERM", "WRONGTYPE", "WRONGPASS", "NOAUTH", "NOSCRIPT":
		return true
	case "ERR":
		// A script refused a command (no permission), a command Redis
		// does not know (renamed, disabled), a script error: all stay.
		// Too many clients passes.
		return !strings.Contains(msg, "max number of clients")
	}
	return false
}
