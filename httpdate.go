package retryhttp

import (
	"net/http"
	"time"
)

// parseHTTPDate is http.ParseTime with a fast path for the one form
// RFC 9110 says a server must send (IMF-fixdate, "Mon, 02 Jan 2006
// 15:04:05 GMT"): a host that announces a quota dates every answer, and
// http.ParseTime costs about 140 ns of a success that should cost tens.
// Anything the fast path does not take exactly, other case, the obsolete
// forms, a field out of range, goes to http.ParseTime, so both accept the
// same strings and give the same time (FuzzHTTPDate holds them to it).
func parseHTTPDate(v string) (time.Time, error) {
	if t, ok := imfFixdate(v); ok {
		return t, nil
	}
	return http.ParseTime(v)
}

// imfFixdate reads an IMF-fixdate in its exact case, with every field in
// range; ok is false for anything else. The weekday must be a day's name
// but is not checked against the date, as time.Parse does not.
func imfFixdate(v string) (time.Time, bool) {
	const n = len("Mon, 02 Jan 2006 15:04:05 GMT")
	if len(v) != n || v[3] != ',' || v[4] != ' ' || v[7] != ' ' || v[11] != ' ' || v[16] != ' ' ||
		v[19] != ':' || v[22] != ':' || v[25:] != " GMT" || !weekdayName(v[:3]) {
		return time.Time{}, false
	}
	month := monthOf(v[8:11])
	day, ok1 := digits(v[5:7])
	year, ok2 := digits(v[12:16])
	hour, ok3 := digits(v[17:19])
	minute, ok4 := digits(v[20:22])
	sec, ok5 := digits(v[23:25])
	if month == 0 || !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || hour > 23 || minute > 59 || sec > 59 ||
		day < 1 || day > daysIn(month, year) {
		return time.Time{}, false
	}
	return time.Date(year, month, day, hour, minute, sec, 0, time.UTC), true
}

// digits reads a run of ASCII digits; ok is false if any byte is not one.
func digits(s string) (n int, ok bool) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func weekdayName(s string) bool {
	switch s {
	case "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun":
		return true
	}
	return false
}

// monthOf is the month a three-letter English name in its exact case
// names, 0 for none.
func monthOf(s string) time.Month {
	const names = "JanFebMarAprMayJunJulAugSepOctNovDec"
	for i := 0; i < len(names); i += 3 {
		if names[i:i+3] == s {
			return time.Month(i/3 + 1)
		}
	}
	return 0
}

// daysIn is the number of days of month in year, in the proleptic
// Gregorian calendar that time.Parse validates against.
func daysIn(m time.Month, year int) int {
	if m == time.February {
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	}
	return monthDays[m-1]
}

var monthDays = [12]int{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
