package retryhttp

import (
	"net/http"
	"testing"
)

// httpDateSeeds are dates the fast path takes and dates it must leave to
// http.ParseTime: other case, other forms, fields out of range.
var httpDateSeeds = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT", "Sun, 29 Feb 2004 23:59:59 GMT", "Thu, 01 Jan 1970 00:00:00 GMT",
	"Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", "Wed, 29 Feb 2000 00:00:00 GMT",
	"Mon, 29 Feb 1900 00:00:00 GMT", "Mon, 31 Apr 2026 00:00:00 GMT", "Mon, 00 Jan 2026 00:00:00 GMT",
	"Mon, 01 Jan 2026 24:00:00 GMT", "Mon, 01 Jan 2026 00:60:00 GMT", "Mon, 01 Jan 2026 00:00:60 GMT",
	"mon, 01 jan 2026 00:00:00 GMT", "MON, 01 JAN 2026 00:00:00 GMT", "Mon, 01 Jan 2026 00:00:00 gmt",
	"Xyz, 01 Jan 2026 00:00:00 GMT", "Mon, 01 Foo 2026 00:00:00 GMT", "Mon, 1 Jan 2026 00:00:00 GMT ",
	"Mon, 01 Jan 2026 00:00:00 UTC", "Mon, 0x Jan 2026 00:00:00 GMT", "Mon, 01 Jan -026 00:00:00 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT", "Mon Jan  2 15:04:05 2006", "", "Mon, 01 Jan 2026 00:00:00 GMT\x00",
}

// TestHTTPDateAsParseTime: the fast path gives what http.ParseTime gives,
// for every seed, taken or refused.
func TestHTTPDateAsParseTime(t *testing.T) {
	taken := 0
	for _, v := range httpDateSeeds {
		checkHTTPDate(t, v)
		if _, ok := imfFixdate(v); ok {
			taken++
		}
	}
	if taken < 6 {
		t.Errorf("the fast path took %d seeds, want the 6 valid IMF-fixdates at least", taken)
	}
}

func checkHTTPDate(t *testing.T, v string) {
	t.Helper()
	want, werr := http.ParseTime(v)
	got, gerr := parseHTTPDate(v)
	if (werr == nil) != (gerr == nil) || !got.Equal(want) || got.Location().String() != want.Location().String() {
		t.Errorf("parseHTTPDate(%q) = %v, %v; http.ParseTime: %v, %v", v, got, gerr, want, werr)
	}
	if ft, ok := imfFixdate(v); ok && (werr != nil || !ft.Equal(want)) {
		t.Errorf("imfFixdate(%q) = %v, took what http.ParseTime gives as %v, %v", v, ft, want, werr)
	}
}

func FuzzHTTPDate(f *testing.F) {
	for _, v := range httpDateSeeds {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) { checkHTTPDate(t, v) })
}

// BenchmarkHTTPDate is the Date of every answer of a host that announces a
// quota: the fast path against http.ParseTime.
func BenchmarkHTTPDate(b *testing.B) {
	const v = "Mon, 02 Jan 2006 15:04:05 GMT"
	b.Run("parseHTTPDate", func(b *testing.B) {
		for b.Loop() {
			_, _ = parseHTTPDate(v)
		}
	})
	b.Run("http.ParseTime", func(b *testing.B) {
		for b.Loop() {
			_, _ = http.ParseTime(v)
		}
	})
}
