package retryhttp

import (
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
		secs, ok := parseSeconds(firstValue(h, "X-Ratelimit-Reset"))
		if !ok {
			return 0, false
		}
		base := serverNow(h, now).Unix()
		if secs < base/2 {
			return time.Duration(secs) * time.Second, true
		}
		return time.Duration(min(max(0, secs-base), maxDelaySeconds)) * time.Second, true
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
		remaining, reset := "", ""
		for param := range strings.SplitSeq(member, ";") {
			key, val, found := strings.Cut(strings.TrimSpace(param), "=")
			if !found {
				continue
			}
			switch key = strings.TrimSpace(key); {
			case strings.EqualFold(key, "r"):
				remaining = val
			case strings.EqualFold(key, "t"):
				reset = val
			case strings.EqualFold(key, "remaining"):
				dictRemaining = val
			case strings.EqualFold(key, "reset"):
				dictReset = val
			}
		}
		if isZero(remaining) {
			if s, good := parseSeconds(reset); good && (!ok || s > secs) {
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

// namesWait reports whether a response carries a header from which
// serverWait can take a wait: a cheap test, so that the success path parses
// nothing. Retry-After counts only on the statuses where serverWait reads
// it, so a 200 costs three lookups, not four.
func (t *Transport) namesWait(resp *http.Response) bool {
	h := resp.Header
	if len(h["X-Ratelimit-Remaining"]) > 0 || len(h["Ratelimit-Remaining"]) > 0 || len(h["Ratelimit"]) > 0 {
		return true
	}
	code := resp.StatusCode
	return (t.retryStatus(code) || code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) &&
		len(h["Retry-After"]) > 0
}

// serverWait is the wait a response names: Retry-After where it means "come
// back later" (429, 503 and the statuses the Transport retries), else the
// reset of a spent quota, on any response. ok is false when it names none.
func (t *Transport) serverWait(resp *http.Response, now time.Time) (time.Duration, bool) {
	if t.retryStatus(resp.StatusCode) || resp.StatusCode == http.StatusTooManyRequests ||
		resp.StatusCode == http.StatusServiceUnavailable {
		if w, ok := retryAfter(resp.Header, now); ok {
			return w, true
		}
	}
	return quotaReset(resp.Header, now)
}
