package retryhttp

import (
	"math"
	"time"
)

// instant is a moment in a host's record: nanoseconds since its limiter's
// epoch, plus longAgo, 8 bytes where a time.Time takes 24. A record holds
// some thirty moments; as time.Times they were a third of its size. Zero
// means none, as a zero time.Time did, and reads as a zero time.Time did:
// long before any moment the record sees, so that "how long since it last
// refused" of a host that never refused is longer than any hold.
// Differences are the monotonic clock's, as time.Time's Sub is. Sums and
// differences saturate, as time.Time's Sub does: a remote value (a reset
// two centuries away, which a header may say) is a moment past every
// other, not one that wraps to before them all.
type instant int64

// Add is a+d, saturated.
func (a instant) Add(d time.Duration) instant {
	s := a + instant(d)
	switch {
	case d > 0 && s < a:
		return math.MaxInt64
	case d < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// Sub is a-b, saturated.
func (a instant) Sub(b instant) time.Duration {
	d := a - b
	switch {
	case b < 0 && d < a:
		return math.MaxInt64
	case b > 0 && d > a:
		return math.MinInt64
	}
	return time.Duration(d)
}

func (a instant) Before(b instant) bool { return a < b }
func (a instant) After(b instant) bool  { return a > b }
func (a instant) Equal(b instant) bool  { return a == b }
func (a instant) IsZero() bool          { return a == 0 }

// longAgo is how long before the limiter's epoch the zero instant is: ten
// years, longer than any wait the model compares with, and far from the
// 292 years an int64 of nanoseconds holds.
const longAgo = 10 * 365 * 24 * time.Hour

// at is t as an instant of the record; the zero time is the zero instant.
func (m *hostModel) at(t time.Time) instant { return instantOf(*m.epoch, t) }

// at is t as an instant of the limiter's epoch, the one its entries'
// moments and its models' are counted from.
func (l *localLimiter) at(t time.Time) instant { return instantOf(l.epoch, t) }

// instantOf is t as an instant counted from epoch; the zero time is the
// zero instant.
func instantOf(epoch, t time.Time) instant { return atSince(t, t.Sub(epoch)) }

// atSince is instantOf(epoch, t) given d, t.Sub(epoch), which its caller
// has made for something else.
func atSince(t time.Time, d time.Duration) instant {
	if t.IsZero() {
		return 0
	}
	return instant(d).Add(longAgo)
}

// timeOf is the moment an instant counted from epoch stands for; the zero
// instant is the zero time.
func timeOf(epoch time.Time, a instant) time.Time {
	if a == 0 {
		return time.Time{}
	}
	return epoch.Add(time.Duration(a.Add(-longAgo)))
}

// time is a as a time.Time; the zero instant is the zero time.
func (m *hostModel) time(a instant) time.Time { return timeOf(*m.epoch, a) }
