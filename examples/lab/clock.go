package main

import (
	"bytes"
	"container/heap"
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
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
// A sleeper whose context ends is woken at that instant, after the others
// due then (see settle): when the clock learns of it must not change when
// it wakes.
//
// Clock implements retryhttp.Clock. Sleep must be called only by a
// participant (a function passed to Run or Go), and only while it runs.
type Clock struct {
	mu    sync.Mutex
	now   time.Time
	seq   uint64 // orders wake-ups at the same instant: first asleep, first awake
	queue wakeups
	live  int // participants started and not yet finished
	// cancellable counts the sleepers queued whose context can end, and
	// settled the times the scheduler settled (see settle): the sleepers
	// it finds cancelled at the same settling wake together.
	cancellable int
	settled     uint64

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
	if w.done = ctx.Done(); w.done != nil {
		c.cancellable++
	}
	c.mu.Unlock()
	c.yield <- struct{}{} // the turn goes back to the scheduler
	// Woken by the scheduler only, at the end of the wait or once it found
	// ctx ended: it says which, so the answer is the same on every run.
	<-w.wake
	if w.cancelled {
		return ctx.Err()
	}
	return nil
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
		if c.cancellable > 0 && c.queue[0].at.After(c.now) {
			c.mu.Unlock()
			c.settle()
			c.mu.Lock()
		}
		w := heap.Pop(&c.queue).(*wakeup)
		if w.done != nil {
			c.cancellable--
		}
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

// settle runs before the clock moves on while a sleeper that can be
// cancelled is queued: it waits until the turns handed out so far have had
// all their effects, then wakes now every sleeper whose context has ended.
//
// A turn can end a sleeper's context from outside the clock: retryhttp
// waits for a slot in flight on a context that a goroutine of its own
// cancels once another request frees the slot, and that goroutine runs in
// real time, after the turn that freed it. Were the clock moved on before
// it ran, the sleeper would wake at a later moment, a different one on
// every run. So settle waits for every other goroutine of the process to
// block. The sleepers it finds cancelled wake after those already due now,
// in the order they went to sleep; a cancellation that their turns cause
// is found at the next settling, before the clock moves on again. Settling
// only then, not before every turn, keeps the lab fast: it takes a dump of
// all goroutines.
func (c *Clock) settle() {
	// First let what is plainly still running finish: the dump is dear.
	for i := 0; i < 3 && runnable(); i++ {
		runtime.Gosched()
	}
	for deadline := time.Now().Add(stallLimit); !quiescent(); runtime.Gosched() {
		if time.Now().After(deadline) {
			panic(fmt.Sprintf("lab: goroutines kept running for %v of real time while the clock waited", stallLimit))
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settled++
	for _, w := range c.queue {
		if w.done == nil || w.cancelled || !w.at.After(c.now) {
			continue
		}
		select {
		case <-w.done:
			w.at, w.cancelled, w.gen = c.now, true, c.settled
			heap.Fix(&c.queue, w.index)
		default:
		}
	}
}

// runnable is the runtime's count of goroutines ready to run, read
// cheaply: approximate (settle asks quiescent for the exact answer), but
// when it is not zero, something is still to run.
func runnable() bool {
	metrics.Read(runnableSample)
	return runnableSample[0].Value.Kind() == metrics.KindUint64 && runnableSample[0].Value.Uint64() > 0
}

var runnableSample = []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}

// stacks is the buffer quiescent reads the goroutines into; only the
// scheduler uses it.
var stacks = make([]byte, 64<<10)

// quiescent reports whether every goroutine but the caller is blocked:
// none is runnable, running, in a system call or being moved. It reads
// each one's state from the runtime's dump of all goroutines, the one
// exact account the runtime gives of them (it stops the world to take it).
func quiescent() bool {
	n := runtime.Stack(stacks, true)
	for n == len(stacks) {
		stacks = make([]byte, 2*len(stacks))
		n = runtime.Stack(stacks, true)
	}
	first := true // the dump starts with the caller, which is running
	for line := range bytes.Lines(stacks[:n]) {
		if !bytes.HasPrefix(line, []byte("goroutine ")) {
			continue
		}
		if first {
			first = false
			continue
		}
		for _, busy := range busyStates {
			if bytes.Contains(line, busy) {
				return false
			}
		}
	}
	return true
}

// busyStates are the states of a goroutine that is not blocked, as the
// dump writes them.
var busyStates = [][]byte{[]byte(" [runnable"), []byte(" [running"), []byte(" [syscall"), []byte(" [copystack"), []byte(" [preempted")}

// wakeup is a participant waiting for its turn.
type wakeup struct {
	at    time.Time
	seq   uint64
	index int             // in the queue; -1 once popped
	done  <-chan struct{} // the sleeper's context's, when it can end
	// cancelled is set when settle found done closed, and gen is which
	// settling that was.
	cancelled bool
	gen       uint64
	wake      chan struct{}
}

// wakeups is a min-heap by time; at one instant, the sleepers due then
// come first, by seq, then those cancelled, by settling and seq.
type wakeups []*wakeup

func (q wakeups) Len() int { return len(q) }
func (q wakeups) Less(i, j int) bool {
	a, b := q[i], q[j]
	switch {
	case !a.at.Equal(b.at):
		return a.at.Before(b.at)
	case a.cancelled != b.cancelled:
		return b.cancelled
	case a.gen != b.gen:
		return a.gen < b.gen
	}
	return a.seq < b.seq
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
