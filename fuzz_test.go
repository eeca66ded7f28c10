package retryhttp

// Fuzz targets for the parsing of server-named waits (issue 4): whatever a
// server puts in Retry-After, Date and the rate-limit headers, nothing
// panics, no wait is negative, and through the Transport no wait is longer
// than the configured max. Helpers are named rel*, like those of
// reliability_*_test.go.
//
// Run each for a while with
//
//	go test -run '^$' -fuzz '^FuzzRetryAfter$' -fuzztime 60000x .
//	go test -run '^$' -fuzz '^FuzzRateLimitHeaders$' -fuzztime 60000x .
//
// A count rather than a duration: with Go 1.26 a -fuzztime duration can end
// in a spurious "context deadline exceeded" failure (go.dev/issue/75804,
// fixed in Go 1.27). 60,000 runs take 5 to 10 s here.

import (
	"context"
	"errors"
	"io"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// relFakeClock is a Clock whose Sleep records the wait and moves the time
// on by it, at once.
type relFakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *relFakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *relFakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	if d > 0 {
		c.now = c.now.Add(d)
	}
	c.mu.Unlock()
	return ctx.Err()
}

// The fuzzed Transport's bounds.
const (
	relFuzzFloor      = time.Second
	relFuzzMax        = 60 * time.Second
	relFuzzBackoffMax = 2 * time.Second
)

// relFuzzNow is the fake clock's start, close to the real now, so that
// epoch values near today's mean what they would in production.
var relFuzzNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// relFuzzStatuses are the statuses a fuzzed response may have. A fuzzed
// code picks one (code % len) and, in the targets below, where the fuzzed
// values go (code / len).
var relFuzzStatuses = []int{429, 503, 500, 200, 403, 301, 529, 520}

// relFuzzCode is the fuzz code for the status at index i and the layout l.
func relFuzzCode(i, l int) uint8 { return uint8(i + l*len(relFuzzStatuses)) }

// relFuzzTransport sends two requests through a Transport whose in-memory
// base answers every try with status and h, on a fake clock, and checks
// that every wait the Transport reports or makes is in [0, max], that a
// named wait it retries after is at least the floor, and that each request
// ends with the base's answer or a fast failure on a parked host.
//
// With learning on, the hostile headers reach the learner too: a pace it
// learns adds to the waits (up to a slot of the slowest learned pace per
// request), and every sleep stays within the max all the same.
func relFuzzTransport(t *testing.T, status int, h http.Header) {
	relFuzzOnce(t, status, h, false)
	relFuzzOnce(t, status, h, true)
}

func relFuzzOnce(t *testing.T, status int, h http.Header, learning bool) {
	clk := &relFakeClock{now: relFuzzNow}
	var events []RetryEvent
	sent := 0
	base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		return relResponse(r, status, h.Clone(), relNewBody(3), 3), nil
	})
	tr := New(
		WithBase(base),
		WithClock(clk),
		WithBudget(nil),
		WithMaxAttempts(3),
		WithBackoff(100*time.Millisecond, relFuzzBackoffMax),
		WithRetryAfterLimits(relFuzzFloor, relFuzzMax),
		WithRand(func() float64 { return 0.999 }),
		WithLearning(learning),
		onEvents(func(ev RetryEvent) { events = append(events, ev) }),
	)
	maxDelay, maxBackoff := relFuzzMax, relFuzzBackoffMax
	if learning {
		// A learned wait (a spent quota held until its reset, a pace at an
		// announced quota of one a minute) is bounded by the max like a
		// named one, and may follow one: a retry waits out a 429's 7 s,
		// then its host's quota of one in 67 s for the slot 60 s later
		// (each wait within the max, 67 s in all; the fuzzer's
		// c68dab609a8f5786). The slowest pace a cut sets is one attempt a
		// hold.
		slowest := holdTime
		maxDelay, maxBackoff = 2*maxDelay+relFuzzBackoffMax+2*slowest, maxBackoff+relFuzzMax+2*slowest
	}
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodGet, "http://fuzz.test/x", nil)
		resp, err := tr.RoundTrip(req)
		switch {
		case err != nil && resp != nil:
			t.Fatalf("request %d: both a response and an error (%v)", i, err)
		case err != nil:
			if !errors.Is(err, ErrHostPaused) && !errors.Is(err, ErrHostDown) {
				t.Fatalf("request %d: error %v, want the base's answer, ErrHostPaused or ErrHostDown", i, err)
			}
		default:
			if resp.StatusCode != status {
				t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, status)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "zzz" {
				t.Fatalf("request %d: body %q, want the base's, unread", i, b)
			}
		}
	}
	_, named := serverWait(&http.Response{StatusCode: status, Header: h}, waitFamilies(h, status, quotaHeaders(h)), relFuzzNow)
	for _, ev := range events {
		if ev.Delay < 0 || ev.Delay > maxDelay {
			t.Fatalf("event delay %v outside [0, %v]: %+v", ev.Delay, maxDelay, ev)
		}
		if ev.Reason == "" && named && ev.Delay < relFuzzFloor {
			t.Fatalf("a named wait of %v, below the floor %v", ev.Delay, relFuzzFloor)
		}
		if ev.Reason == "" && !named && ev.Delay > maxBackoff {
			t.Fatalf("a backoff of %v, beyond its max %v", ev.Delay, maxBackoff)
		}
	}
	for _, d := range clk.sleeps {
		if d < 0 || d > relFuzzMax {
			t.Fatalf("slept %v, outside [0, %v]; all sleeps %v", d, relFuzzMax, clk.sleeps)
		}
	}
	// X-Should-Retry: false is final: no retry, one try a request at most.
	if retry, said := shouldRetryHeader(h); said && !retry {
		if sent > 2 || len(events) != 0 {
			t.Fatalf("X-Should-Retry: false, yet %d tries for 2 requests, events %+v", sent, events)
		}
	}
}

// relHeader builds a header from pairs, skipping empty values.
func relHeader(kv ...string) http.Header {
	h := make(http.Header)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			h[kv[i]] = []string{kv[i+1]}
		}
	}
	return h
}

func FuzzRetryAfter(f *testing.F) {
	const (
		imf     = "Sun, 01 Mar 2026 12:00:30 GMT"  // IMF-fixdate, 30 s after the clock
		rfc850  = "Sunday, 01-Mar-26 12:00:30 GMT" // RFC 850
		asctime = "Sun Mar  1 12:00:30 2026"       // asctime
	)
	seeds := []struct{ value, date string }{
		{"0", ""}, {"1", ""}, {"30", ""}, {"120", ""}, {"86400", ""}, {"-1", ""}, {"+5", ""},
		{"1.5", ""}, {"0x10", ""}, {"1e3", ""}, {"", ""}, {" ", ""}, {"  7\t", ""}, {"5, 6", ""}, {"5 6", ""},
		{"9223372036", ""}, {"9223372037", ""}, {"9999999999999999999", ""}, {"99999999999999999999999", ""},
		{"18446744073709551616", ""}, {"٣", ""}, {"\x00", ""},
		{imf, ""}, {rfc850, ""}, {asctime, ""},
		{imf, "Sun, 01 Mar 2026 12:00:00 GMT"}, {imf, "Sun, 01 Mar 2026 11:59:20 GMT"}, // server clock 40 s behind
		{rfc850, "Sunday, 01-Mar-26 12:00:00 GMT"}, {asctime, "Sun Mar  1 12:00:00 2026"},
		{"Mon, 01 Mar 2026 12:00:30 GMT", ""},   // wrong weekday
		{"Sun, 31 Feb 2026 12:00:30 GMT", ""},   // no such day
		{"Sun, 01 Mar 2026 12:00:30 UTC", ""},   // not GMT
		{"Sun, 01 Mar 2026 12:00:30 +0000", ""}, // numeric zone
		{"Thu, 01 Jan 1970 00:00:00 GMT", ""}, {"Fri, 31 Dec 9999 23:59:59 GMT", ""},
		{"Mon, 01 Jan 0001 00:00:00 GMT", ""}, {imf, "Fri, 31 Dec 9999 23:59:59 GMT"},
		{imf, "Mon, 01 Jan 0001 00:00:00 GMT"}, {imf, "garbage"}, {imf + ", " + imf, ""},
		{" " + imf + " ", ""}, {strings.ToLower(imf), ""},
	}
	seeds = append(seeds, []struct{ value, date string }{
		{"2.5", ""}, {"2.", ""}, {".5", ""}, {"0.0", ""}, {"1.5.5", ""}, {".", ""}, {"-2.5", ""}, {"1,5", ""},
		{"9223372036.854775807", ""}, {"9223372036854775807.5", ""}, {"3000", ""}, {"1500.25", ""},
		{"9223372036854", ""}, {"9223372036855", ""}, {"1." + strings.Repeat("0", 62) + "1", ""},
		{"Inf", ""}, {"NaN", ""}, {"0x1p3", ""}, {"1_000", ""},
		{"true", ""}, {"false", ""}, {" FALSE ", ""},
	}...)
	for _, s := range seeds {
		for _, code := range []uint8{relFuzzCode(0, 0), relFuzzCode(1, 0), relFuzzCode(4, 0),
			relFuzzCode(0, 1), relFuzzCode(1, 2), relFuzzCode(6, 3), relFuzzCode(2, 4), relFuzzCode(4, 4)} {
			f.Add(s.value, s.date, code)
		}
	}
	f.Fuzz(func(t *testing.T, value, date string, code uint8) {
		// Where value goes, by code: Retry-After; retry-after-ms;
		// x-ms-retry-after-ms; retry-after-ms beside "Retry-After: 1";
		// X-Should-Retry beside "Retry-After: 1".
		var h http.Header
		unit := time.Second
		switch layout := int(code) / len(relFuzzStatuses) % 5; layout {
		case 0:
			h = relHeader("Retry-After", value, "Date", date)
		case 1:
			h, unit = relHeader("Retry-After-Ms", value, "Date", date), time.Millisecond
		case 2:
			h, unit = relHeader("X-Ms-Retry-After-Ms", value, "Date", date), time.Millisecond
		case 3:
			h, unit = relHeader("Retry-After-Ms", value, "Retry-After", "1", "Date", date), time.Millisecond
		default:
			h = relHeader("X-Should-Retry", value, "Retry-After", "1", "Date", date)
			relFuzzTransport(t, relFuzzStatuses[int(code)%len(relFuzzStatuses)], h)
			return
		}
		wait, ok := retryAfter(h, relFuzzNow)
		if ok && wait < 0 {
			t.Fatalf("retryAfter(%q, Date %q) = %v, negative", value, date, wait)
		}
		if !ok && wait != 0 {
			t.Fatalf("retryAfter(%q) = %v but not ok", value, wait)
		}
		// Whole units are read as such. (More than 19 digits are refused,
		// whatever they are: no Duration needs more, and it bounds the work
		// a hostile value costs.)
		v := strings.TrimSpace(value)
		if len(v) <= 19 && strings.Trim(v, "0123456789") == "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if v != "" && err == nil && n <= int64(1<<63-1)/int64(unit) && (!ok || wait != time.Duration(n)*unit) {
				t.Fatalf("%v: %v, %v; want %d × %v", h, wait, ok, n, unit)
			}
		}
		// A decimal number is never cut short, and rounded up to a whole
		// unit: exactly, as the digits say it (a float64 reads
		// 1.0000000000000001 as 1, which the digits are not).
		if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f*float64(unit) < 1<<62 && len(v) <= maxNumberLen &&
			strings.Trim(v, "0123456789.") == "" && strings.Count(v, ".") <= 1 {
			exact, _ := new(big.Rat).SetString(v)
			units := new(big.Int).Quo(exact.Num(), exact.Denom())
			if new(big.Rat).SetInt(units).Cmp(exact) < 0 {
				units.Add(units, big.NewInt(1))
			}
			if want := time.Duration(units.Int64()) * unit; !ok || wait != want {
				t.Fatalf("%v: %v, want %v (%s rounded up to the %v)", h, wait, want, v, unit)
			}
		}
		relFuzzTransport(t, relFuzzStatuses[int(code)%len(relFuzzStatuses)], h)
	})
}

func FuzzRateLimitHeaders(f *testing.F) {
	epoch := strconv.FormatInt(relFuzzNow.Unix()+30, 10)
	seeds := []struct{ rl, rlRemaining, rlReset, xRemaining, xReset, date string }{
		{rl: `"default";r=0;t=30`},
		{rl: `"default";r=5;t=30`},
		{rl: `"a";r=0;t=10, "b";r=0;t=50`},
		{rl: `"burst";r=0;t=1;pk=:AQID:, "day";r=10;t=3600`},
		{rl: `limit=100, remaining=0, reset=30`},
		{rl: `limit=100, remaining=1, reset=30`},
		{rl: `remaining=0, reset=-5`},
		{rl: `remaining=0, reset=1.5`},
		{rl: `"x";R=0;T=30`},
		{rl: `r=0;t=99999999999999999999`},
		{rl: `;;;,,,=;=,`},
		{rl: `"default";r=0;t=30`, xRemaining: "0", xReset: epoch},
		{rlRemaining: "0", rlReset: "30"},
		{rlRemaining: "0", rlReset: "86400"},
		{rlRemaining: "00", rlReset: " 5 "},
		{rlRemaining: "1", rlReset: "30"},
		{rlRemaining: "0", rlReset: "Sun, 01 Mar 2026 12:00:30 GMT"},
		{xRemaining: "0", xReset: epoch},                                                // GitHub: epoch seconds
		{xRemaining: "0", xReset: epoch, date: "Sun, 01 Mar 2026 11:59:50 GMT"},         // counted from Date
		{xRemaining: "0", xReset: "1700000000"},                                         // an epoch in the past
		{xRemaining: "0", xReset: "60"},                                                 // a delay, not an epoch
		{xRemaining: "0", xReset: "886000000"},                                          // just under half of now: a delay of 28 years
		{xRemaining: "0", xReset: "9223372036"},                                         // the largest
		{xRemaining: "0", xReset: "0", date: "Mon, 01 Jan 0001 00:00:00 GMT"},           // a server clock at year 1
		{xRemaining: "0", xReset: "9223372036", date: "Mon, 01 Jan 0001 00:00:00 GMT"},  // both ends
		{xRemaining: "0", xReset: "62135596800", date: "Mon, 01 Jan 0001 00:00:00 GMT"}, // year 1 to the epoch
		{xRemaining: "0", xReset: epoch, date: "Fri, 31 Dec 9999 23:59:59 GMT"},
		{xRemaining: "0", xReset: "-1"},
		{xRemaining: "0", xReset: "1.5"},
		{xRemaining: "-0", xReset: "30"},
		{xRemaining: "0", xReset: "99999999999999999999"},
	}
	for _, s := range seeds {
		for _, code := range []uint8{relFuzzCode(0, 0), relFuzzCode(3, 0)} {
			f.Add(s.rl, s.rlRemaining, s.rlReset, s.xRemaining, s.xReset, s.date, code)
		}
	}
	// The LLM families (layouts 1 and 2): rl is the limit of requests,
	// xRemaining and xReset what remains of it and its reset, rlRemaining
	// and rlReset those of tokens.
	rfc := func(d time.Duration) string { return relFuzzNow.Add(d).Format(time.RFC3339) }
	llmSeeds := []struct{ rl, rlRemaining, rlReset, xRemaining, xReset, date string }{
		{"60", "", "", "0", "3s", ""}, {"60", "149984", "6ms", "59", "1s", ""}, {"60", "0", "6m0s", "0", "1s", ""},
		{"", "0", "1m30.5s", "", "", ""}, {"60", "", "", "0", "12ms", ""}, {"60", "", "", "0", "1h2m3.5s", ""},
		{"60", "", "", "0", "5", ""}, {"60", "", "", "0", "1.5", ""}, {"60", "", "", "0", "-1s", ""},
		{"60", "", "", "0", "+1s", ""}, {"60", "", "", "0", "1d", ""}, {"60", "", "", "0", "3000000h", ""},
		{"60", "", "", "0", "9223372036854775807ns", ""}, {"60", "", "", "0", ".5s", ""}, {"60", "", "", "0", "1e3s", ""},
		{"0", "", "", "0", "3s", ""}, {"4294967296", "", "", "1", "3s", ""},
		{"50", "", "", "0", rfc(3 * time.Second), ""},
		{"50", "", "", "0", rfc(3 * time.Second), "Sun, 01 Mar 2026 11:59:50 GMT"},
		{"50", "0", rfc(40 * time.Second), "10", rfc(time.Second), ""},
		{"50", "", "", "0", rfc(-time.Hour), ""},
		{"50", "", "", "0", "9999-12-31T23:59:59Z", "Mon, 01 Jan 0001 00:00:00 GMT"},
		{"50", "", "", "0", "0001-01-01T00:00:00Z", "Fri, 31 Dec 9999 23:59:59 GMT"},
		{"50", "", "", "0", "2026-03-01T12:00:03.999999999+14:00", ""},
		{"50", "", "", "0", "2026-13-01T12:00:03Z", ""}, {"50", "", "", "0", "Sun, 01 Mar 2026 12:00:30 GMT", ""},
	}
	for _, s := range llmSeeds {
		for _, code := range []uint8{relFuzzCode(0, 1), relFuzzCode(3, 1), relFuzzCode(0, 2), relFuzzCode(4, 2)} {
			f.Add(s.rl, s.rlRemaining, s.rlReset, s.xRemaining, s.xReset, s.date, code)
		}
	}
	f.Fuzz(func(t *testing.T, rl, rlRemaining, rlReset, xRemaining, xReset, date string, code uint8) {
		status := relFuzzStatuses[int(code)%len(relFuzzStatuses)]
		if layout := int(code) / len(relFuzzStatuses) % 3; layout != 0 {
			relFuzzLLMQuotas(t, layout, status, rl, rlRemaining, rlReset, xRemaining, xReset, date)
			return
		}
		h := relHeader("Ratelimit", rl, "Ratelimit-Remaining", rlRemaining, "Ratelimit-Reset", rlReset,
			"X-Ratelimit-Remaining", xRemaining, "X-Ratelimit-Reset", xReset, "Date", date)
		wait, ok := quotaReset(h, relFuzzNow)
		if ok && wait < 0 {
			t.Fatalf("quotaReset(%v) = %v, negative", h, wait)
		}
		if secs, ok := parseRateLimitField(rl); ok && secs < 0 {
			t.Fatalf("parseRateLimitField(%q) = %d, negative", rl, secs)
		}
		// A reset in epoch seconds that lies ahead of the server's clock
		// names a wait of exactly that far ahead, however odd the clock.
		if _, hasRL := h["Ratelimit"]; !hasRL && !isZero(rlRemaining) && isZero(xRemaining) {
			secs, good := parseSeconds(xReset)
			base := serverNow(h, relFuzzNow).Unix()
			if good && secs >= base/2 && secs > base {
				want := time.Duration(secs-base) * time.Second
				if secs-base > maxDelaySeconds {
					want = -1 // does not fit a Duration: any answer >= 0 will do
				}
				if !ok || wait < 0 || (want >= 0 && wait != want) {
					t.Fatalf("X-RateLimit-Reset %s with Date %q: wait %v, %v; want %v", xReset, date, wait, ok, want)
				}
			}
		}
		relFuzzTransport(t, relFuzzStatuses[int(code)%len(relFuzzStatuses)], h)
	})
}

// relFuzzLLMQuotas checks the quota headers of OpenAI (layout 1) or
// Anthropic (layout 2): whatever they say, no wait is negative, a spent
// quota of requests with a usable reset waits at least until that reset,
// an announcement is whole, and through the Transport every sleep stays
// within the max.
func relFuzzLLMQuotas(t *testing.T, layout, status int, limit, tokRemaining, tokReset, remaining, reset, date string) {
	family, readReset := openAIQuotas[:], func(v string, h http.Header) (time.Duration, bool) { return parseResetDuration(v) }
	if layout == 2 {
		family = anthropicQuotas[:2]
		readReset = func(v string, h http.Header) (time.Duration, bool) { return untilTime(v, h, relFuzzNow) }
	}
	req, tok := family[0], family[1]
	h := relHeader(req.limit, limit, req.remaining, remaining, req.reset, reset,
		tok.remaining, tokRemaining, tok.reset, tokReset, "Date", date)
	wait, ok := quotaReset(h, relFuzzNow)
	if wait < 0 || (!ok && wait != 0) {
		t.Fatalf("quotaReset(%v) = %v, %v", h, wait, ok)
	}
	if isZero(remaining) {
		if want, good := readReset(reset, h); good && (!ok || wait < want) {
			t.Fatalf("quotaReset(%v) = %v, %v; want at least %v", h, wait, ok, want)
		}
	}
	a := announced(h, relFuzzNow)
	if a.limit < 0 || a.window != 0 || a.reset < -1 || a.remaining < -1 || (a.limit == 0 && a != announcement{}) {
		t.Fatalf("announced(%v) = %+v", h, a)
	}
	if a.limit > 0 && remaining != "" && !quotaHeaders(h) {
		t.Fatalf("announced(%v) = %+v, but quotaHeaders says there is nothing to read", h, a)
	}
	relFuzzTransport(t, status, h)
}
