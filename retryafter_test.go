package retryhttp

import (
	"net/http"
	"strconv"
	"testing"
	"time"
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
		{"fractional", "1.5", "", 0, false},
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
