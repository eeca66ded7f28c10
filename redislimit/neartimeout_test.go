package redislimit_test

import (
	"fmt"
	"testing"
	"time"
)

// TestLinkNearTimeout: Redis's replies take about as long as the default
// 50 ms timeout, for three processes at a shared 20/s, so that some calls
// answer in time and others do not. Each fall to the in-process pacer
// costs a process the slots it holds back until the others stop counting
// it present, so a process flipping between Redis and its fallback at
// every late call sent 13.6-18.0/s for the three: the pace must hold
// within 10 %, with at most one burst above it, wherever the latency sits
// around the timeout: mostly in time with a tail late (10-60 ms, where a
// process that went back at an answer in time fell again within a second:
// 17.2-19.6/s, a busiest second of 24-25 in three runs of nine), about half
// in time, most late, all late. The four bands run in parallel, 8 s each.
func TestLinkNearTimeout(t *testing.T) {
	for _, c := range []struct{ lo, hi time.Duration }{
		{10 * time.Millisecond, 60 * time.Millisecond},  // mostly in time, a tail late
		{30 * time.Millisecond, 80 * time.Millisecond},  // about half in time (issue 27)
		{40 * time.Millisecond, 100 * time.Millisecond}, // most late
		{60 * time.Millisecond, 120 * time.Millisecond}, // all late
	} {
		t.Run(fmt.Sprintf("%v-%v", c.lo, c.hi), func(t *testing.T) {
			t.Parallel()
			linkNearTimeout(t, c.lo, c.hi)
		})
	}
}

func linkNearTimeout(t *testing.T, lo, hi time.Duration) {
	// A run over either bound is run once more (runOnceMore): in process
	// all through (60-120 ms), a loaded machine under -race held a second
	// of 23 once in 28 runs, where the limiter had nothing to decide.
	runOnceMore(t, func(try int, last bool) bool {
		// The link slows once every process has been counted with its
		// full share, as in TestSlowLink.
		const slow, total = 2 * time.Second, 8 * time.Second
		host, start, _, fell := slowLinkFleet(t, lo, hi, slow, total)
		ts := host.served()
		t.Logf("run %d: per second: %s", try, perSecond(ts, start, total))
		host.members(t, start, total)
		t.Logf("run %d: each member first paced in process at %v", try, fell)
		// The pace is measured from a second after the slowing, the
		// falls included: each process's first fall costs it the slots
		// it holds back until the others stop counting it present, once,
		// as any outage does. That cost was 0.3-0.9 s of its share, its
		// claim's deadline counting twice the gap between its bunches of
		// wants (time spent waiting for its own slots), and a window from
		// a fixed moment held one to three of those falls (16.0-19.8/s in
		// eleven runs, 17.4-21.2 later), so the test measured from a
		// second after the last member's first fall; that is logged too.
		// A process that fell again at every late call, the fault this
		// test is for, flips all through the window (12.8-16.6/s).
		from := slow + time.Second
		after := from
		for _, f := range fell {
			after = max(after, f+time.Second)
		}
		after = min(after, total-3*time.Second)
		rate := float64(len(between(ts, start.Add(from), start.Add(total)))) / (total - from).Seconds()
		t.Logf("run %d: %.1f/s on the link near the timeout, from %v (from %v, a second after the last first fall: %.1f/s)", try, rate, from, after,
			float64(len(between(ts, start.Add(after), start.Add(total))))/(total-after).Seconds())
		// From the slowing on: the start, at a 50 ms timeout on a loaded
		// machine, is another matter (a process's first calls can time
		// out while it is alone in Redis's count).
		off := rate < 0.9*pace || rate > 1.1*pace
		if !last && (off || overBusiest(ts, start, start.Add(slow), start.Add(total))) {
			return true
		}
		checkBusiest(t, "on the slow link", ts, start, start.Add(slow), start.Add(total))
		if off {
			t.Errorf("%.1f/s on the link near the timeout from %v, want the pace of %d/s within 10%%", rate, from, pace)
		}
		return false
	})
}
