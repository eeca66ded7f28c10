package retryhttp

import (
	"context"
	"time"
)

// Clock is the Transport's source of time: every timestamp it takes and every
// wait it makes goes through it. The default is the real clock.
//
// Tests do not need a Clock: run the Transport inside a testing/synctest
// bubble and the real clock is virtual there. WithClock exists for
// simulations outside tests, such as examples/lab, which replay minutes of
// traffic in milliseconds.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d, or until ctx is done, whichever comes first. It
	// returns ctx.Err() when ctx ended the wait and nil otherwise. A d of
	// zero or less returns at once.
	Sleep(ctx context.Context, d time.Duration) error
}

// realClock is the default Clock: time.Now and a timer.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		// No timer for a zero wait: a retry with nothing to wait for costs
		// no more than the request itself.
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
