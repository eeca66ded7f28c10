package retryhttp

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A server names a wait in one of two ways: Retry-After (RFC 9110 §10.2.3),
// or rate-limit headers saying the quota is spent and when it comes back.
// Both are remote input: everything here parses defensively, and what it
// returns is bounded by the caller (floor, max, MaxParking) before it
// reaches a sleep or a parking.

// maxDelaySeconds is the largest delay-seconds that still fits a Duration.
const maxDelaySeconds = int64(1<<63-1) / int64(time.Second)

// Longer values than these are not parsed at all: an HTTP-date is 29 bytes
// (asctime 24), and a RateLimit field of a few policies a few hundred. A
// hostile header of megabytes costs a length check, not a parse.
const (
	maxDateLen      = 64
	maxRateLimitLen = 4096
)

// retryAfter returns the wait a response's Retry-After names, counted from
// the response's own Date when it has one (the server's clock, so a skew
// between the clocks does not matter), else from now. ok is false when the
// header is absent or unusable: not a whole number of seconds and not an
// HTTP-date, negative, fractional or too large for a Duration. A date in
// the past names a wait of zero.
func retryAfter(h http.Header, now time.Time) (wait time.Duration, ok bool) {
	v := firstValue(h, "Retry-After")
	if v == "" {
		return 0, false
	}
	if secs, ok := parseSeconds(v); ok {
		return time.Duration(secs) * time.Second, true
	}
	if len(v) > maxDateLen {
		return 0, false
	}
	when, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, when.Sub(serverNow(h, now))), true
}

// serverNow is the response's Date when it has a valid one, else now.
func serverNow(h http.Header, now time.Time) time.Time {
	if d := firstValue(h, "Date"); d != "" && len(d) <= maxDateLen {
		if t, err := http.ParseTime(d); err == nil {
			return t
		}
	}
	return now
}

// quotaReset returns the wait until the quota resets when a response says
// its quota is spent. It reads, in order:
//   - RateLimit, the structured field of the IETF httpapi draft, in its
//     current list form (`"default";r=0;t=30`) and its earlier dictionary
//     form (`limit=100, remaining=0, reset=30`);
//   - RateLimit-Remaining with RateLimit-Reset (delay seconds);
//   - X-RateLimit-Remaining with X-RateLimit-Reset, GitHub style: epoch
//     seconds, counted from the response's Date when it has one; a value
//     under half of now's epoch seconds is a delay in seconds instead.
//
// ok is false when no header says the quota is spent, or the reset is
// unusable.
func quotaReset(h http.Header, now time.Time) (wait time.Duration, ok bool) {
	if v := firstValue(h, "Ratelimit"); v != "" && len(v) <= maxRateLimitLen {
		if secs, ok := parseRateLimitField(v); ok {
			return time.Duration(secs) * time.Second, true
		}
	}
	if isZero(firstValue(h, "Ratelimit-Remaining")) {
		if secs, ok := parseSeconds(firstValue(h, "Ratelimit-Reset")); ok {
			return time.Duration(secs) * time.Second, true
		}
	}
	if isZero(firstValue(h, "X-Ratelimit-Remaining")) {
		return epochOrDelay(firstValue(h, "X-Ratelimit-Reset"), h, now)
	}
	return 0, false
}

// parseRateLimitField reads the RateLimit field and returns the reset of a
// spent quota. In the list form each member is a policy with parameters r
// (remaining) and t (reset); in the dictionary form remaining and reset are
// members of their own. The longest reset among spent policies wins.
func parseRateLimitField(v string) (secs int64, ok bool) {
	dictRemaining, dictReset := "", ""
	for member := range strings.SplitSeq(v, ",") {
		p := memberParams(member)
		if p.remaining != "" {
			dictRemaining = p.remaining
		}
		if p.reset != "" {
			dictReset = p.reset
		}
		if isZero(p.r) {
			if s, good := parseSeconds(p.t); good && (!ok || s > secs) {
				secs, ok = s, true
			}
		}
	}
	if isZero(dictRemaining) {
		if s, good := parseSeconds(dictReset); good && (!ok || s > secs) {
			secs, ok = s, true
		}
	}
	return secs, ok
}

// rateLimitParams are the parameters of one member of the RateLimit
// field: r and t in the list form, remaining and reset in the dictionary
// form; empty when absent.
type rateLimitParams struct{ r, t, remaining, reset string }

func memberParams(member string) rateLimitParams {
	var p rateLimitParams
	for param := range strings.SplitSeq(member, ";") {
		key, val, found := strings.Cut(strings.TrimSpace(param), "=")
		if !found {
			continue
		}
		switch key = strings.TrimSpace(key); {
		case strings.EqualFold(key, "r"):
			p.r = val
		case strings.EqualFold(key, "t"):
			p.t = val
		case strings.EqualFold(key, "remaining"):
			p.remaining = val
		case strings.EqualFold(key, "reset"):
			p.reset = val
		}
	}
	return p
}

// parseSeconds reads a whole, non-negative number of seconds that fits a
// Duration, with optional surrounding white space. Anything else, a sign, a
// fraction, a second value, is refused.
func parseSeconds(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 19 {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > maxDelaySeconds {
		return 0, false
	}
	return n, true
}

func isZero(v string) bool {
	n, ok := parseSeconds(v)
	return ok && n == 0
}

// firstValue is Header.Get for a key already in canonical form: it skips the
// canonicalisation, which matters on the success path.
func firstValue(h http.Header, canonicalKey string) string {
	if v := h[canonicalKey]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// announcement is a quota a response announces: limit requests per window
// (0 when it names no window: the reset tells it), reset until it is whole
// again (-1: not said), remaining left of it (-1: not said). A zero limit
// means no announcement.
type announcement struct {
	limit     int
	window    time.Duration
	reset     time.Duration
	remaining int
}

// announced reads the quota a response announces, from the first of:
//   - RateLimit-Policy, of the IETF httpapi draft, in its current form
//     (`"default";q=100;w=60`) or its earlier one (`100;w=60`); several
//     policies: the slowest;
//   - RateLimit-Limit (an earlier draft), with RateLimit-Reset as a delay;
//   - X-RateLimit-Limit, with X-RateLimit-Reset as epoch seconds or a delay
//     (GitHub, go-chi/httprate, throttled and most others).
//
// Values that are not whole numbers, a zero limit or window, and numbers
// too large for a Duration are ignored: the answer announces nothing.
func announced(h http.Header, now time.Time) announcement {
	a := announcement{reset: -1, remaining: -1}
	if v := firstValue(h, "Ratelimit-Policy"); v != "" && len(v) <= maxRateLimitLen {
		a.limit, a.window = parsePolicy(v)
	}
	if a.limit == 0 {
		if v := firstValue(h, "Ratelimit-Limit"); v != "" && len(v) <= maxRateLimitLen {
			a.limit, a.window = parsePolicy(v)
		}
	}
	if a.limit > 0 {
		if secs, ok := parseSeconds(firstValue(h, "Ratelimit-Reset")); ok {
			a.reset = time.Duration(secs) * time.Second
		}
		a.remaining = remainingOf(firstValue(h, "Ratelimit-Remaining"))
		if v := firstValue(h, "Ratelimit"); v != "" && len(v) <= maxRateLimitLen {
			if r, t, ok := parseRateLimitState(v); ok {
				a.remaining, a.reset = r, t
			}
		}
		return a
	}
	n, ok := parseSeconds(firstValue(h, "X-Ratelimit-Limit"))
	if !ok || n <= 0 || n > math.MaxInt32 {
		return announcement{}
	}
	a.limit = int(n)
	if w, ok := epochOrDelay(firstValue(h, "X-Ratelimit-Reset"), h, now); ok {
		a.reset = w
	}
	a.remaining = remainingOf(firstValue(h, "X-Ratelimit-Remaining"))
	return a
}

// parsePolicy reads a quota policy list and returns the slowest policy's
// quota and window: a member's quota is its q parameter, or the member
// itself when it is a number; its window the w parameter, 0 when absent.
func parsePolicy(v string) (quota int, window time.Duration) {
	best := math.Inf(1)
	for member := range strings.SplitSeq(v, ",") {
		q, w := int64(-1), int64(0)
		for i, param := range strings.Split(member, ";") {
			param = strings.TrimSpace(param)
			key, val, found := strings.Cut(param, "=")
			switch {
			case !found && i == 0:
				if n, ok := parseSeconds(param); ok {
					q = n
				}
			case strings.EqualFold(strings.TrimSpace(key), "q"):
				if n, ok := parseSeconds(val); ok {
					q = n
				}
			case strings.EqualFold(strings.TrimSpace(key), "w"):
				if n, ok := parseSeconds(val); ok {
					w = n
				}
			}
		}
		if q <= 0 || q > math.MaxInt32 || w > int64(learnMaxWindow/time.Second) {
			continue
		}
		// A policy without a window is slower than any with one only if
		// nothing else is known; keep the first such.
		r := math.Inf(1)
		if w > 0 {
			r = float64(q) / float64(w)
		}
		if quota == 0 || r < best {
			quota, window, best = int(q), time.Duration(w)*time.Second, r
		}
	}
	return quota, window
}

// parseRateLimitState reads the remaining quota and its reset from the
// RateLimit field's list form (`"default";r=50;t=30`), the policy with the
// least remaining.
func parseRateLimitState(v string) (remaining int, reset time.Duration, ok bool) {
	for member := range strings.SplitSeq(v, ",") {
		p := memberParams(member)
		r := remainingOf(p.r)
		if r >= 0 && (!ok || r < remaining) {
			remaining, reset, ok = r, -1, true
			if t, good := parseSeconds(p.t); good {
				reset = time.Duration(t) * time.Second
			}
		}
	}
	return remaining, reset, ok
}

// remainingOf reads a remaining count, -1 when absent or unusable.
func remainingOf(v string) int {
	n, ok := parseSeconds(v)
	if !ok || n > math.MaxInt32 {
		return -1
	}
	return int(n)
}

// epochOrDelay reads X-RateLimit-Reset: epoch seconds, counted from the
// response's Date when it has one; a value under half of now's epoch
// seconds is a delay in seconds instead.
func epochOrDelay(v string, h http.Header, now time.Time) (time.Duration, bool) {
	secs, ok := parseSeconds(v)
	if !ok {
		return 0, false
	}
	base := serverNow(h, now).Unix()
	if secs < base/2 {
		return time.Duration(secs) * time.Second, true
	}
	return time.Duration(min(max(0, secs-base), maxDelaySeconds)) * time.Second, true
}
