package retryhttp

import "time"

// instant is a moment in a host's record: nanoseconds since the record's
// base, 8 bytes where a time.Time takes 24. A record holds some thirty
// moments; as time.Times they were a third of its size. Zero means none,
// as a zero time.Time did: the base is a second before the record began,
// so no moment the record sees is its zero but by a nanosecond's chance.
// Differences are the monotonic clock's, as time.Time's Sub is.
type instant int64

func (a instant) Add(d time.Duration) instant { return a + instant(d) }
func (a instant) Sub(b instant) time.Duration { return time.Duration(a - b) }
func (a instant) Before(b instant) bool       { return a < b }
func (a instant) After(b instant) bool        { return a > b }
func (a instant) Equal(b instant) bool        { return a == b }
func (a instant) IsZero() bool                { return a == 0 }

// baseSlack puts a record's base before its first moment, so that moment
// is not the zero instant.
const baseSlack = time.Second

// at is t as an instant of the record; the zero time is the zero instant.
func (m *hostModel) at(t time.Time) instant {
	if t.IsZero() {
		return 0
	}
	return instant(t.Sub(m.base))
}

// time is a as a time.Time; the zero instant is the zero time.
func (m *hostModel) time(a instant) time.Time {
	if a == 0 {
		return time.Time{}
	}
	return m.base.Add(time.Duration(a))
}
