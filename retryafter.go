package retryhttp

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A server names a wait in one of two ways: a Retry-After (RFC 9110
// §10.2.3, or its millisecond forms), or rate-limit headers saying the quota
// is spent and when it comes back. Both are remote input: everything here
// parses defensively, and what it returns is bounded by the caller (floor,
// max, MaxParking) before it reaches a sleep or a parking.

// maxDelaySeconds is the largest delay-seconds that still fits a Duration.
const maxDelaySeconds = int64(1<<63-1) / int64(time.Second)

// Longer values than these are not parsed at all: an HTTP-date is 29 bytes
// (asctime 24), an RFC 3339 time 35 at most, a number or a Go duration of
// any use a few dozen, and a RateLimit field of a few policies a few
// hundred. A hostile header of megabytes costs a length check, not a parse.
const (
	maxDateLen      = 64
	maxNumberLen    = 64
	maxRateLimitLen = 4096
)

// The canonical keys of the waits named in milliseconds, in the order they
// are preferred to Retry-After: retry-after-ms (OpenAI, Azure OpenAI and
// every Stainless-generated SDK), x-ms-retry-after-ms (Azure, Cosmos DB).
// Both are finer than a Retry-After beside them, which the SDKs that read
// them ignore when they are there.
var msWaitHeaders = [...]string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"}

// retryAfter returns the wait a response names: Retry-After-Ms or
// X-Ms-Retry-After-Ms when one is usable, else Retry-After, in seconds or
// as an HTTP-date counted from the response's own Date when it has one (the
// server's clock, so a skew between the clocks does not matter), else from
// now. A fraction of the header's unit is rounded up: a wait named is never
// cut short. ok is false when no header is usable: absent, not a
// non-negative decimal number and not an HTTP-date, or too large for a
// Duration. A date in the past names a wait of zero.
func retryAfter(h http.Header, now time.Time) (wait time.Duration, ok bool) {
	for _, key := range msWaitHeaders {
		if v := firstValue(h, key); v != "" {
			if d, ok := parseDecimal(v, time.Millisecond); ok {
				return d, true
			}
		}
	}
	v := firstValue(h, "Retry-After")
	if v == "" {
		return 0, false
	}
	if d, ok := parseDecimal(v, time.Second); ok {
		return d, true
	}
	if len(v) > maxDateLen {
		return 0, false
	}
	when, err := parseHTTPDate(v)
	if err != nil {
		return 0, false
	}
	return max(0, when.Sub(serverNow(h, now))), true
}

// parseDecimal reads a non-negative decimal number of units, with optional
// surrounding white space: digits with at most one point among them
// ("30", "2.5", "2.", ".5"). A fraction is rounded up to the next whole
// unit. A sign, an exponent, a second value, more than maxNumberLen bytes or
// a number of units beyond a Duration are refused.
func parseDecimal(v string, unit time.Duration) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > maxNumberLen {
		return 0, false
	}
	whole, frac, dotted := strings.Cut(v, ".")
	if whole == "" && frac == "" {
		return 0, false // a point alone
	}
	if strings.Trim(whole, "0123456789") != "" || (dotted && strings.Trim(frac, "0123456789") != "") {
		return 0, false
	}
	var n int64
	if whole = strings.TrimLeft(whole, "0"); whole != "" {
		if len(whole) > 19 {
			return 0, false
		}
		var err error
		if n, err = strconv.ParseInt(whole, 10, 64); err != nil {
			return 0, false
		}
	}
	limit := int64(1<<63-1) / int64(unit)
	roundUp := strings.Trim(frac, "0") != ""
	if n > limit || (roundUp && n == limit) {
		return 0, false
	}
	if roundUp {
		n++
	}
	return time.Duration(n) * unit, true
}

// serverNow is the response's Date when it has a valid one, else now.
func serverNow(h http.Header, now time.Time) time.Time {
	if d := firstValue(h, "Date"); d != "" && len(d) <= maxDateLen {
		if t, err := parseHTTPDate(d); err == nil {
			return t
		}
	}
	return now
}

// quotaReset returns the wait until the quota resets when a response says
// its quota is spent: the longest reset among the quotas it says are spent,
// in any of these families:
//   - RateLimit, the structured field of the IETF httpapi draft, in its
//     current list form (`"default";r=0;t=30`) and its earlier dictionary
//     form (`limit=100, remaining=0, reset=30`);
//   - RateLimit-Remaining with RateLimit-Reset (delay seconds);
//   - X-RateLimit-Remaining with X-RateLimit-Reset, GitHub style: epoch
//     seconds, counted from the response's Date when it has one; a value
//     under half of now's epoch seconds is a delay in seconds instead;
//   - OpenAI's x-ratelimit-remaining-requests and -tokens, with
//     x-ratelimit-reset-requests and -tokens as Go durations ("1s", "6m0s",
//     "12ms") or seconds;
//   - Anthropic's anthropic-ratelimit-requests-, -tokens-, -input-tokens-
//     and -output-tokens-remaining, with the -reset beside each as an RFC
//     3339 time, counted from the response's Date when it has one.
//
// ok is false when no header says a quota is spent, or no reset of one is
// usable.
func quotaReset(h http.Header, now time.Time) (wait time.Duration, ok bool) {
	return quotaResetIn(h, limitFamiliesOf(h), now)
}

// quotaResetIn is quotaReset given the families h may hold
// (limitFamiliesOf), which the caller read for announced too.
func quotaResetIn(h http.Header, f limitFamilies, now time.Time) (wait time.Duration, ok bool) {
	if f == 0 {
		return 0, false // no header of a quota: none of the lookups below can find one
	}
	longest := func(d time.Duration, good bool) {
		if good && (!ok || d > wait) {
			wait, ok = d, true
		}
	}
	if f&famRateLimit != 0 {
		if v := firstValue(h, "Ratelimit"); v != "" && len(v) <= maxRateLimitLen {
			secs, good := parseRateLimitField(v)
			longest(time.Duration(secs)*time.Second, good)
		}
		if isZero(firstValue(h, "Ratelimit-Remaining")) {
			secs, good := parseSeconds(firstValue(h, "Ratelimit-Reset"))
			longest(time.Duration(secs)*time.Second, good)
		}
	}
	if f&famXRateLimit != 0 {
		if isZero(firstValue(h, "X-Ratelimit-Remaining")) {
			longest(epochOrDelay(firstValue(h, "X-Ratelimit-Reset"), h, now))
		}
	}
	if f&famOpenAI != 0 {
		for _, q := range openAIQuotas {
			if isZero(firstValue(h, q.remaining)) {
				longest(parseResetDuration(firstValue(h, q.reset)))
			}
		}
	}
	if f&famAnthropic != 0 {
		for _, q := range anthropicQuotas {
			if isZero(firstValue(h, q.remaining)) {
				longest(untilTime(firstValue(h, q.reset), h, now))
			}
		}
	}
	return wait, ok
}

// quotaKeys are the canonical keys of one quota's headers.
type quotaKeys struct{ limit, remaining, reset string }

// The quotas of the LLM APIs. The first of each family counts requests,
// which learning paces; the others count tokens, of which a request spends
// a number nobody knows beforehand: when spent, they park the host until
// their reset, but announce no pace.
var (
	// OpenAI (and the APIs that copy it: Azure OpenAI, Groq and others).
	openAIQuotas = [...]quotaKeys{
		{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
	}
	// Anthropic.
	anthropicQuotas = [...]quotaKeys{
		{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
		{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
		{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
		{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
	}
)

// quotaHeaders reports whether a response says what remains of a quota of
// requests, in any family that announced and quotaReset read: the question
// the success path asks before it reads any of them. It costs five lookups
// of canonical keys, no allocation. A host that announces a quota, or spends
// one of tokens, says what remains of its requests too, so the remaining
// count of requests of each family is enough.
func quotaHeaders(h http.Header) bool {
	return len(h) != 0 && (len(h["X-Ratelimit-Remaining"]) > 0 || len(h["Ratelimit-Remaining"]) > 0 || len(h["Ratelimit"]) > 0 ||
		len(h["X-Ratelimit-Remaining-Requests"]) > 0 || len(h["Anthropic-Ratelimit-Requests-Remaining"]) > 0)
}

// mayLimitScan is the most headers limitFamiliesOf reads the names of:
// past it, the lookups cost less than the reading.
const mayLimitScan = 8

// limitFamilies says which families of quota headers a response may hold,
// one bit each: quotaReset looks up only those of the families there.
type limitFamilies uint8

const (
	famRateLimit  limitFamilies = 1 << iota // Ratelimit, Ratelimit-* (the IETF draft's)
	famXRateLimit                           // X-Ratelimit-* but OpenAI's (GitHub's and most APIs')
	famOpenAI                               // X-Ratelimit-*-Requests and -Tokens
	famAnthropic                            // Anthropic-Ratelimit-*
	famAll        = famRateLimit | famXRateLimit | famOpenAI | famAnthropic
)

// limitFamiliesOf reports the families of quota headers h may hold: every
// header quotaReset reads is named Ratelimit*, X-Ratelimit* or
// Anthropic-Ratelimit*, canonical as quotaReset's keys are. One pass over
// a few names (none for an empty header) instead of nine lookups, on the
// successes of a host with a record; a family is left out only when none
// of its headers is there (past mayLimitScan names, none is).
func limitFamiliesOf(h http.Header) limitFamilies {
	if len(h) > mayLimitScan {
		return famAll
	}
	var f limitFamilies
	for k := range h {
		f |= rateLimitFamily(k)
	}
	return f
}

// mayLimit reports whether h may hold a header that quotaReset reads.
func mayLimit(h http.Header) bool { return limitFamiliesOf(h) != 0 }

// rateLimitFamily is the quota family of a canonical header name, if any.
func rateLimitFamily(k string) limitFamilies {
	switch {
	case len(k) >= 9 && k[0] == 'R' && k[:9] == "Ratelimit":
		return famRateLimit
	case len(k) >= 11 && k[0] == 'X' && k[:11] == "X-Ratelimit":
		if strings.HasSuffix(k, "-Requests") || strings.HasSuffix(k, "-Tokens") {
			return famOpenAI
		}
		return famXRateLimit
	case len(k) >= 19 && k[0] == 'A' && k[:19] == "Anthropic-Ratelimit":
		return famAnthropic
	}
	return 0
}

// scopedQuota reports an answer whose X-RateLimit-* headers are of one
// resource of the host among several (GitHub's X-RateLimit-Resource: search,
// graphql, code_search, ... beside core, each its own quota under the same
// names): a quota of some endpoints, not of the host. "core" is GitHub's
// quota of the host's other endpoints, and is the host's.
func scopedQuota(h http.Header) bool {
	v := firstValue(h, "X-Ratelimit-Resource")
	return v != "" && !strings.EqualFold(v, "core")
}

// parseResetDuration reads an OpenAI reset: a Go duration ("1s", "6m0s",
// "1m30.5s", "12ms") or a bare number of seconds (rounded up, as Azure
// OpenAI sends them). A sign, a unit Go does not know, more than
// maxNumberLen bytes or a duration beyond a Duration are refused.
func parseResetDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > maxNumberLen {
		return 0, false
	}
	if d, ok := parseDecimal(v, time.Second); ok {
		return d, true
	}
	if c := v[0]; c != '.' && (c < '0' || c > '9') {
		return 0, false // a sign, or no number at all
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

// untilTime reads an RFC 3339 time and returns how far ahead it is, counted
// from the response's Date when it has one (the server's clock), else from
// now; a time in the past is a wait of zero.
func untilTime(v string, h http.Header, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > maxDateLen {
		return 0, false
	}
	when, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, false
	}
	return max(0, when.Sub(serverNow(h, now))), true
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
	// Accumulated here rather than by strconv: it is read on every answer
	// of a host that announces a quota, and n stays under maxDelaySeconds
	// (about 9.2e9), so 10n plus a digit cannot overflow.
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
		if n > maxDelaySeconds {
			return 0, false
		}
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

// announced reads the quota of requests a response announces, from the
// first of:
//   - RateLimit-Policy, of the IETF httpapi draft, in its current form
//     (`"default";q=100;w=60`) or its earlier one (`100;w=60`); several
//     policies: the slowest;
//   - RateLimit-Limit (an earlier draft), with RateLimit-Reset as a delay;
//   - X-RateLimit-Limit, with X-RateLimit-Reset as epoch seconds or a delay
//     (GitHub, go-chi/httprate, throttled and most others);
//   - OpenAI's x-ratelimit-limit-requests, with -remaining-requests and
//     -reset-requests (a Go duration);
//   - Anthropic's anthropic-ratelimit-requests-limit, with -remaining and
//     -reset (an RFC 3339 time).
//
// The last three name no window: the reset tells it. Values that are not
// whole numbers, a zero limit or window, and numbers too large for a
// Duration are ignored: the answer announces nothing.
func announced(h http.Header, now time.Time) announcement {
	return announcedIn(h, limitFamiliesOf(h), now)
}

// announcedIn is announced given the families h may hold
// (limitFamiliesOf): it looks up only the headers of those, as a host
// sends one family (each lookup is about a tenth of a learned quota's
// success).
func announcedIn(h http.Header, f limitFamilies, now time.Time) announcement {
	a := announcement{reset: -1, remaining: -1}
	if f&famRateLimit != 0 {
		if v := firstValue(h, "Ratelimit-Policy"); v != "" && len(v) <= maxRateLimitLen {
			a.limit, a.window = parsePolicy(v)
		}
		if v := firstValue(h, "Ratelimit-Limit"); a.limit == 0 && v != "" && len(v) <= maxRateLimitLen {
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
	if f&famXRateLimit != 0 {
		if a, ok := requestQuota(h, "X-Ratelimit-Limit", "X-Ratelimit-Remaining"); ok {
			if w, ok := epochOrDelay(firstValue(h, "X-Ratelimit-Reset"), h, now); ok {
				a.reset = w
			}
			return a
		}
	}
	oa, an := openAIQuotas[0], anthropicQuotas[0]
	if f&famOpenAI != 0 {
		if a, ok := requestQuota(h, oa.limit, oa.remaining); ok {
			if w, ok := parseResetDuration(firstValue(h, oa.reset)); ok {
				a.reset = w
			}
			return a
		}
	}
	if f&famAnthropic == 0 {
		return announcement{}
	}
	if a, ok := requestQuota(h, an.limit, an.remaining); ok {
		if w, ok := untilTime(firstValue(h, an.reset), h, now); ok {
			a.reset = w
		}
		return a
	}
	return announcement{}
}

// requestQuota reads a quota's limit and what remains of it, with no reset
// yet: ok is false when the limit is not a whole number from 1 to MaxInt32.
func requestQuota(h http.Header, limitKey, remainingKey string) (announcement, bool) {
	n, ok := parseSeconds(firstValue(h, limitKey))
	if !ok || n <= 0 || n > math.MaxInt32 {
		return announcement{}, false
	}
	return announcement{limit: int(n), reset: -1, remaining: remainingOf(firstValue(h, remainingKey))}, true
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
