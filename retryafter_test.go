package retryhttp

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		name    string
		value   string
		date    string // the response's Date header
		want    time.Duration
		present bool
	}{
		{"seconds", "30", "", 30 * time.Second, true},
		{"zero", "0", "", 0, true},
		{"white space", " 120 ", "", 120 * time.Second, true},
		{"a day", "86400", "", 24 * time.Hour, true},
		{"IMF-fixdate", date(50 * time.Second), "", 50 * time.Second, true},
		{"RFC 850", now.Add(50 * time.Second).Format("Monday, 02-Jan-06 15:04:05 GMT"), "", 50 * time.Second, true},
		{"asctime", now.Add(50 * time.Second).Format(time.ANSIC), "", 50 * time.Second, true},
		{"date counted from the answer's Date", date(90 * time.Second), date(-40 * time.Second), 130 * time.Second, true},
		{"date in the past", date(-time.Minute), "", 0, true},
		{"garbage Date header: count from now", date(50 * time.Second), "yesterday", 50 * time.Second, true},
		{"absent", "", "", 0, false},
		{"negative", "-1", "", 0, false},
		{"fractional, rounded up", "1.5", "", 2 * time.Second, true},
		{"plus sign", "+5", "", 0, false},
		{"words", "soon", "", 0, false},
		{"two values", "5, 10", "", 0, false},
		{"overflow", "99999999999999999999", "", 0, false},
		{"beyond a Duration", strconv.FormatInt(maxDelaySeconds+1, 10), "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.value != "" {
				h.Set("Retry-After", tt.value)
			}
			if tt.date != "" {
				h.Set("Date", tt.date)
			}
			got, ok := retryAfter(h, now)
			if got != tt.want || ok != tt.present {
				t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tt.value, got, ok, tt.want, tt.present)
			}
		})
	}
}

func TestQuotaResetParsing(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	tests := []struct {
		name    string
		headers map[string]string
		want    time.Duration
		present bool
	}{
		{"GitHub epoch", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(time.Minute)}, time.Minute, true},
		{"GitHub epoch from the answer's Date", map[string]string{"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset": epoch(time.Minute), "Date": now.Add(-time.Minute).Format(http.TimeFormat)}, 2 * time.Minute, true},
		{"GitHub epoch passed", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": epoch(-time.Minute)}, 0, true},
		{"delay seconds", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}, 30 * time.Second, true},
		{"quota left", map[string]string{"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "30"}, 0, false},
		{"no reset", map[string]string{"X-RateLimit-Remaining": "0"}, 0, false},
		{"bad reset", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "-5"}, 0, false},
		{"draft headers", map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "12"}, 12 * time.Second, true},
		{"structured list", map[string]string{"RateLimit": `"default";r=0;t=30`}, 30 * time.Second, true},
		{"structured list, quota left", map[string]string{"RateLimit": `"default";r=5;t=30`}, 0, false},
		{"structured, two policies", map[string]string{"RateLimit": `"burst";r=3;t=1, "day";r=0;t=3600`}, time.Hour, true},
		{"dictionary form", map[string]string{"RateLimit": "limit=100, remaining=0, reset=30"}, 30 * time.Second, true},
		{"dictionary, quota left", map[string]string{"RateLimit": "limit=100, remaining=7, reset=30"}, 0, false},
		{"nothing", map[string]string{}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			got, ok := quotaReset(h, now)
			if got != tt.want || ok != tt.present {
				t.Errorf("quotaReset(%v) = %v, %v; want %v, %v", tt.headers, got, ok, tt.want, tt.present)
			}
		})
	}
}

// wait is what a parser returns, for cmp.Diff.
type wait struct {
	D  time.Duration
	OK bool
}

// header builds an http.Header from pairs, canonicalising the keys as
// net/http does when it reads a response.
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// R17: waits in milliseconds are preferred to a coarser Retry-After beside
// them; a fraction of a header's unit is rounded up, never cut.
func TestRetryAfterDialects(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		h    http.Header
		want wait
	}{
		{"retry-after-ms beside a coarser Retry-After", header("retry-after-ms", "3000", "Retry-After", "1"), wait{3 * time.Second, true}},
		{"retry-after-ms alone", header("retry-after-ms", "250"), wait{250 * time.Millisecond, true}},
		{"x-ms-retry-after-ms", header("x-ms-retry-after-ms", "3000"), wait{3 * time.Second, true}},
		{"x-ms-retry-after-ms beside Retry-After", header("x-ms-retry-after-ms", "1500", "Retry-After", "10"), wait{1500 * time.Millisecond, true}},
		{"retry-after-ms before x-ms-retry-after-ms", header("retry-after-ms", "100", "x-ms-retry-after-ms", "200"), wait{100 * time.Millisecond, true}},
		{"fractional milliseconds rounded up", header("retry-after-ms", "1500.2"), wait{1501 * time.Millisecond, true}},
		{"unusable retry-after-ms: Retry-After", header("retry-after-ms", "soon", "Retry-After", "2"), wait{2 * time.Second, true}},
		{"negative retry-after-ms: Retry-After", header("retry-after-ms", "-5", "Retry-After", "2"), wait{2 * time.Second, true}},
		{"retry-after-ms beyond a Duration: Retry-After", header("retry-after-ms", "9223372036855", "Retry-After", "2"), wait{2 * time.Second, true}},
		{"retry-after-ms of the largest Duration", header("retry-after-ms", "9223372036854"), wait{9223372036854 * time.Millisecond, true}},
		{"retry-after-ms alone, unusable", header("retry-after-ms", "1e3"), wait{}},
		{"fractional seconds rounded up", header("Retry-After", "2.5"), wait{3 * time.Second, true}},
		{"a fraction of zeros is whole", header("Retry-After", "2.000"), wait{2 * time.Second, true}},
		{"a trailing point", header("Retry-After", "2."), wait{2 * time.Second, true}},
		{"no whole part", header("Retry-After", ".5"), wait{time.Second, true}},
		{"a tiny fraction", header("Retry-After", "0.000001"), wait{time.Second, true}},
		{"zero with a fraction of zeros", header("Retry-After", "0.0"), wait{0, true}},
		{"leading zeros", header("Retry-After", "0000000000000000000000000000003"), wait{3 * time.Second, true}},
		{"the largest seconds, rounded up past a Duration", header("Retry-After", strconv.FormatInt(maxDelaySeconds, 10)+".5"), wait{}},
		{"two points", header("Retry-After", "1.5.5"), wait{}},
		{"a point alone", header("Retry-After", "."), wait{}},
		{"a negative fraction", header("Retry-After", "-1.5"), wait{}},
		{"a comma for a point", header("Retry-After", "1,5"), wait{}},
		{"an exponent", header("Retry-After", "1e3"), wait{}},
		{"infinity", header("Retry-After", "Inf"), wait{}},
		{"not a number", header("Retry-After", "NaN"), wait{}},
		{"longer than any number", header("Retry-After", "1."+strings.Repeat("0", 100)), wait{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := retryAfter(tt.h, now)
			if diff := cmp.Diff(tt.want, wait{d, ok}); diff != "" {
				t.Errorf("retryAfter(%v) (-want +got):\n%s", tt.h, diff)
			}
		})
	}
}

// R17: the quotas of OpenAI (resets as Go durations) and Anthropic (resets
// as RFC 3339 times) park like those of the X-RateLimit family: the longest
// reset of the quotas that are spent.
func TestQuotaResetDialects(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	rfc := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	tests := []struct {
		name string
		h    http.Header
		want wait
	}{
		{"OpenAI requests spent", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "3s"), wait{3 * time.Second, true}},
		{"OpenAI requests left", header("x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "3s"), wait{}},
		{"OpenAI tokens spent", header("x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "6m0s"), wait{6 * time.Minute, true}},
		{"OpenAI both spent: the longest", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "1m30.5s"), wait{90500 * time.Millisecond, true}},
		{"OpenAI milliseconds", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "12ms"), wait{12 * time.Millisecond, true}},
		{"OpenAI hours", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1h2m3s"), wait{time.Hour + 2*time.Minute + 3*time.Second, true}},
		{"OpenAI bare seconds, as Azure OpenAI", header("x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "5"), wait{5 * time.Second, true}},
		{"OpenAI fractional seconds rounded up", header("x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "1.5"), wait{2 * time.Second, true}},
		{"OpenAI zero", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "0s"), wait{0, true}},
		{"OpenAI negative", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "-1s"), wait{}},
		{"OpenAI plus sign", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "+1s"), wait{}},
		{"OpenAI unknown unit", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1d"), wait{}},
		{"OpenAI beyond a Duration", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "3000000h"), wait{}},
		{"OpenAI no reset", header("x-ratelimit-remaining-requests", "0"), wait{}},
		{"OpenAI unusable remaining", header("x-ratelimit-remaining-requests", "-1", "x-ratelimit-reset-requests", "3s"), wait{}},
		{"Anthropic requests spent", header("anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", rfc(3*time.Second)), wait{3 * time.Second, true}},
		{"Anthropic counted from the answer's Date", header("anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", rfc(3*time.Second), "Date", now.Add(-10*time.Second).Format(http.TimeFormat)), wait{13 * time.Second, true}},
		{"Anthropic with an offset and a fraction", header("anthropic-ratelimit-tokens-remaining", "0",
			"anthropic-ratelimit-tokens-reset", now.Add(2500*time.Millisecond).In(time.FixedZone("", 3600)).Format(time.RFC3339Nano)), wait{2500 * time.Millisecond, true}},
		{"Anthropic input tokens spent", header("anthropic-ratelimit-input-tokens-remaining", "0", "anthropic-ratelimit-input-tokens-reset", rfc(20*time.Second)), wait{20 * time.Second, true}},
		{"Anthropic output tokens spent", header("anthropic-ratelimit-output-tokens-remaining", "0", "anthropic-ratelimit-output-tokens-reset", rfc(40*time.Second)), wait{40 * time.Second, true}},
		{"Anthropic in the past", header("anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", rfc(-time.Minute)), wait{0, true}},
		{"Anthropic quota left", header("anthropic-ratelimit-requests-remaining", "7", "anthropic-ratelimit-requests-reset", rfc(3*time.Second)), wait{}},
		{"Anthropic not RFC 3339", header("anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", now.Add(time.Second).Format(http.TimeFormat)), wait{}},
		{"Anthropic seconds are not a time", header("anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", "3"), wait{}},
		{"families together: the longest", header("x-ratelimit-remaining", "0", "x-ratelimit-reset", "10",
			"anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", rfc(30*time.Second),
			"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "20s"), wait{30 * time.Second, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := quotaReset(tt.h, now)
			if diff := cmp.Diff(tt.want, wait{d, ok}); diff != "" {
				t.Errorf("quotaReset(%v) (-want +got):\n%s", tt.h, diff)
			}
		})
	}
}

// R17: OpenAI's and Anthropic's quotas of requests are announcements that
// learning paces, like X-RateLimit-Limit; their quotas of tokens are not.
func TestAnnouncedDialects(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		h    http.Header
		want announcement
	}{
		{"OpenAI", header("x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "149984", "x-ratelimit-reset-tokens", "6ms"),
			announcement{limit: 60, reset: time.Second, remaining: 59}},
		{"OpenAI without a usable reset", header("x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59", "x-ratelimit-reset-requests", "soon"),
			announcement{limit: 60, reset: -1, remaining: 59}},
		{"Anthropic", header("anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", now.Add(3*time.Second).Format(time.RFC3339)),
			announcement{limit: 50, reset: 3 * time.Second, remaining: 0}},
		{"tokens alone announce nothing", header("x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "0",
			"anthropic-ratelimit-tokens-limit", "80000", "anthropic-ratelimit-tokens-remaining", "0"), announcement{}},
		{"a zero limit announces nothing", header("x-ratelimit-limit-requests", "0", "x-ratelimit-remaining-requests", "0"), announcement{}},
		{"a limit beyond an int32 announces nothing", header("anthropic-ratelimit-requests-limit", "4294967296"), announcement{}},
		{"X-RateLimit-Limit first", header("X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset", "30",
			"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59"), announcement{limit: 10, reset: 30 * time.Second, remaining: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := announced(tt.h, now)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(announcement{})); diff != "" {
				t.Errorf("announced(%v) (-want +got):\n%s", tt.h, diff)
			}
		})
	}
}

// quotaHeaders, the success path's question, says yes to every family
// whose quota of requests announced or quotaReset reads, and no to an
// answer without one, at no allocation.
func TestQuotaHeaders(t *testing.T) {
	yes := []http.Header{
		header("X-RateLimit-Remaining", "5"),
		header("RateLimit-Remaining", "5"),
		header("RateLimit", `"default";r=5;t=30`),
		header("x-ratelimit-remaining-requests", "59"),
		header("anthropic-ratelimit-requests-remaining", "49"),
	}
	for _, h := range yes {
		if !quotaHeaders(h) {
			t.Errorf("quotaHeaders(%v) = false", h)
		}
	}
	for _, h := range []http.Header{{}, header("Content-Type", "application/json", "Retry-After", "3", "X-Should-Retry", "true")} {
		if quotaHeaders(h) {
			t.Errorf("quotaHeaders(%v) = true", h)
		}
	}
	plain := header("Content-Type", "application/json", "Date", "Sun, 29 Nov 2026 12:00:00 GMT", "Content-Length", "2")
	if n := testing.AllocsPerRun(100, func() { quotaHeaders(plain) }); n != 0 {
		t.Errorf("quotaHeaders allocates %v times", n)
	}
}

// BenchmarkQuotaHeaders measures the success path's question about quotas:
// five lookups now, against the three learn.go asks today.
func BenchmarkQuotaHeaders(b *testing.B) {
	plain := header("Content-Type", "application/json", "Date", "Sun, 29 Nov 2026 12:00:00 GMT", "Content-Length", "2",
		"X-Request-Id", "req_1", "Server", "stub")
	b.Run("three", func(b *testing.B) {
		for b.Loop() {
			_ = len(plain["X-Ratelimit-Remaining"]) > 0 || len(plain["Ratelimit-Remaining"]) > 0 || len(plain["Ratelimit"]) > 0
		}
	})
	b.Run("five", func(b *testing.B) {
		for b.Loop() {
			quotaHeaders(plain)
		}
	})
}

// TestMayLimitNames: the pass over a response's header names that spares
// a host with a record quotaReset's lookups on a plain success says yes
// for every name quotaReset reads, and no only for headers of none.
func TestMayLimitNames(t *testing.T) {
	families := map[string]limitFamilies{"Ratelimit": famRateLimit, "Ratelimit-Remaining": famRateLimit, "Ratelimit-Reset": famRateLimit,
		"X-Ratelimit-Remaining": famXRateLimit, "X-Ratelimit-Reset": famXRateLimit}
	for _, q := range openAIQuotas {
		families[q.limit], families[q.remaining], families[q.reset] = famOpenAI, famOpenAI, famOpenAI
	}
	for _, q := range anthropicQuotas {
		families[q.limit], families[q.remaining], families[q.reset] = famAnthropic, famAnthropic, famAnthropic
	}
	for n, fam := range families {
		h := http.Header{"Content-Type": {"text/plain"}, "Date": {"Mon, 02 Jan 2006 15:04:05 GMT"}}
		h.Set(n, "0")
		if !mayLimit(h) {
			t.Errorf("mayLimit misses %s", n)
		}
		// quotaReset looks the name up under its family's bit alone.
		if got := limitFamiliesOf(h); got != fam {
			t.Errorf("limitFamiliesOf(%s) = %b, want %b", n, got, fam)
		}
	}
	if mayLimit(http.Header{}) || mayLimit(http.Header{"Content-Type": {"text/plain"}, "X-Request-Id": {"1"}, "Retry-After": {"1"}}) {
		t.Error("mayLimit says yes of a header without a quota")
	}
	big := http.Header{}
	for i := range mayLimitScan + 1 {
		big.Set("X-Other-"+strconv.Itoa(i), "1")
	}
	if !mayLimit(big) {
		t.Error("past mayLimitScan names, the lookups must run")
	}
}
