package main

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"
)

// epoch is the moment the lab's clock reads at the start of every scenario:
// 1,800,000,000 seconds after 1970, Fri, 15 Jan 2027 08:00:00 GMT, the same
// moment as the shop of seed 002, so the Date headers read the same.
var epoch = time.Unix(1_800_000_000, 0).UTC()

// stallLimit is how long, in real time, a participant may run without
// sleeping on the clock or finishing before the lab gives up on it: a
// participant blocked on something else would otherwise hang the run.
const stallLimit = 30 * time.Second

// Clock is a virtual clock and the scheduler of the goroutines that use it:
// a discrete-event simulation in which every collector, and every request in
// flight, is a participant that waits by calling Sleep.
//
// Exactly one participant runs at a time. When it sleeps or finishes, the
// clock wakes the participant with the earliest wake-up, moving time forward
// to it; ties go to whoever went to sleep first. So time advances only when
// every participant is waiting, and the order of events (which collector's
// request reaches a host first, which draws the next random number) is the
// same on every run. That is what makes the lab print the same figures
// every time, with 50 collectors running concurrently.
//
// Clock implements retryhttp.Clock. Sleep must be called only by a
// participant (a function passed to Run or Go), and only while it runs.
type Clock struct {
	mu    sync.Mutex
	now   time.Time
	seq   uint64 // orders wake-ups at the same instant: first asleep, first awake
	queue wakeups
	live  int // participants started and not yet finished

	// yield is how the running participant hands the turn back: it has gone
	// to sleep, or it has finished.
	yield chan struct{}
}

// NewClock returns a clock that reads epoch.
func NewClock() *Clock {
	return &Clock{now: epoch, yield: make(chan struct{})}
}

// Now returns the virtual time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Since returns the virtual time elapsed since the start of the scenario.
func (c *Clock) Since() time.Duration { return c.Now().Sub(epoch) }

// Sleep waits until the virtual time reaches now+d, letting the other
// participants run meanwhile. It returns nil, or ctx.Err() when ctx ended
// the wait first. A d of zero or less returns at once, without giving up the
// turn.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	w := c.push(c.now.Add(d))
	c.mu.Unlock()
	c.yield <- struct{}{} // the turn goes back to the scheduler
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
		// Cancelled in real time: ask to be woken now, and go on only
		// with the turn, so that two participants never run at once.
		c.mu.Lock()
		if w.index >= 0 {
			c.seq++
			w.at, w.seq = c.now, c.seq
			heap.Fix(&c.queue, w.index)
		}
		c.mu.Unlock()
		<-w.wake
		return ctx.Err()
	}
}

// Go starts f as a participant. It first runs when the scheduler gives it
// its turn, after the participants already waiting for the same instant.
// Go may be called before Run or by a running participant.
func (c *Clock) Go(f func()) {
	c.mu.Lock()
	c.live++
	w := c.push(c.now)
	c.mu.Unlock()
	go func() {
		<-w.wake
		defer func() {
			c.mu.Lock()
			c.live--
			c.mu.Unlock()
			c.yield <- struct{}{}
		}()
		f()
	}()
}

// Run starts each f as a participant, in order, and hands out turns until
// every participant has finished.
func (c *Clock) Run(fs ...func()) {
	for _, f := range fs {
		c.Go(f)
	}
	stall := time.NewTimer(stallLimit)
	defer stall.Stop()
	for {
		c.mu.Lock()
		if c.live == 0 {
			c.mu.Unlock()
			return
		}
		if c.queue.Len() == 0 {
			c.mu.Unlock()
			panic("lab: participants are alive but none is waiting on the clock")
		}
		w := heap.Pop(&c.queue).(*wakeup)
		if w.at.After(c.now) {
			c.now = w.at
		}
		c.mu.Unlock()
		w.wake <- struct{}{}
		stall.Reset(stallLimit)
		select {
		case <-c.yield:
		case <-stall.C:
			panic(fmt.Sprintf("lab: a participant ran %v of real time without sleeping on the clock", stallLimit))
		}
	}
}

// push queues a wake-up at the given moment; c.mu must be held.
func (c *Clock) push(at time.Time) *wakeup {
	c.seq++
	w := &wakeup{at: at, seq: c.seq, wake: make(chan struct{}, 1)}
	heap.Push(&c.queue, w)
	return w
}

// wakeup is a participant waiting for its turn.
type wakeup struct {
	at    time.Time
	seq   uint64
	index int // in the queue; -1 once popped
	wake  chan struct{}
}

// wakeups is a min-heap by (at, seq).
type wakeups []*wakeup

func (q wakeups) Len() int { return len(q) }
func (q wakeups) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q wakeups) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *wakeups) Push(x any) {
	w := x.(*wakeup)
	w.index = len(*q)
	*q = append(*q, w)
}
func (q *wakeups) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	w.index = -1
	*q = old[:len(old)-1]
	return w
}
