package retryhttp

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Budget caps retries at a share of first tries, across every Transport
// that shares it, over a sliding window of ten one-second buckets. While a
// server is down every first try fails, and a per-request limit of three
// tries would triple the load; a budget of 10 % adds a tenth instead.
//
// The count is in integers (fixed point, a millionth of a retry), so ten
// first tries at 10 % allow exactly one retry, with no float rounding to
// lose it.
//
// The budget is for the retries nobody asked for. What each retry costs:
//   - after a failure that named no wait (a 5xx, a 408, a 429 or 503
//     without Retry-After, a transport error): one retry;
//   - after a wait the server named (Retry-After, or the reset of a spent
//     quota), waited out and then admitted through the host's pace: nothing.
//     The server scheduled it, the parking held every request to the host
//     meanwhile, and the attempts still bound it;
//   - a retry refused after it was charged (its host was parked beyond the
//     max while it waited, its deadline came first): nothing, it is refunded;
//   - the retries of a request that succeeds in the end: nothing, they are
//     refunded with its success. A host that fails one answer in three at
//     random costs the budget only the requests whose every try failed (one
//     in 27 with three tries), and gets every retry the others need.
//     (A hedge that lost stays spent: it was an extra request.)
//
// So an outage that answers 503 to everything stays at 110 requests per 100
// pages, while a host that asks for a second's pause between requests is
// not abandoned after the tenth.
//
// A Budget is safe for concurrent use. Recording a first try is lock free;
// only retries, which are rare, take a lock.
type Budget struct {
	ratio   uint64 // retries earned per first try, in millionths
	reserve uint64 // retries granted per window regardless, in millionths

	firsts lazyCounter

	mu      sync.Mutex
	retries [budgetBuckets]uint64 // (second << 32) | count, guarded by mu
}

const (
	budgetBuckets = 10 // one a second: the window is 10 s
	budgetScale   = 1_000_000
	// The caps keep the fixed-point products inside a uint64.
	maxBudgetRatio   = 100.0
	maxBudgetReserve = 1_000_000.0
)

// NewBudget returns a retry budget that allows, over any 10 s window,
// ratio retries per first try plus minPerSecond retries a second in reserve,
// so a quiet client can still retry a blip. The default of every Transport
// is NewBudget(0.1, 1): 10 % of first tries, plus 10 retries per 10 s.
// Negative or NaN arguments count as 0; a ratio above 100 counts as 100, a
// reserve above a million a second as a million.
// NewBudget(0, 0) allows no retry at all.
func NewBudget(ratio, minPerSecond float64) *Budget {
	return &Budget{
		ratio:   fixed(min(ratio, maxBudgetRatio)),
		reserve: fixed(min(minPerSecond, maxBudgetReserve) * budgetBuckets),
	}
}

func fixed(f float64) uint64 {
	if !(f > 0) {
		return 0
	}
	return uint64(math.Round(f * budgetScale))
}

// recordFirst counts a first try, made at now.
func (b *Budget) recordFirst(now time.Time) { b.firsts.add(now) }

// canRetry reports whether the window has a retry to give now, spending
// none.
func (b *Budget) canRetry(now time.Time) bool {
	firsts := b.firsts.sum(now)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.room(now, firsts)
}

// room reports whether one more retry fits the window; b.mu is held.
func (b *Budget) room(now time.Time, firsts uint64) bool {
	sec := uint64(uint32(now.Unix()))
	var retries uint64
	for _, v := range b.retries {
		retries += inWindow(v, sec)
	}
	return (retries+1)*budgetScale <= firsts*b.ratio+b.reserve
}

// tryRetry spends one retry if the window has one to give.
func (b *Budget) tryRetry(now time.Time) bool {
	sec := uint64(uint32(now.Unix()))
	firsts := b.firsts.sum(now)
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.room(now, firsts) {
		return false
	}
	slot := &b.retries[sec%budgetBuckets]
	switch {
	case *slot>>32 == sec:
		*slot++
	case *slot>>32 < sec:
		*slot = sec<<32 | 1
	}
	return true
}

// refund gives back a retry spent at now that did not happen after all.
func (b *Budget) refund(now time.Time) {
	sec := uint64(uint32(now.Unix()))
	b.mu.Lock()
	defer b.mu.Unlock()
	if slot := &b.retries[sec%budgetBuckets]; *slot>>32 == sec && *slot&math.MaxUint32 > 0 {
		*slot--
	}
}

// counter counts events in one-second buckets over the last ten seconds,
// without a lock: each bucket is (second << 32) | count in one word.
type counter [budgetBuckets]atomic.Uint64

// add counts an event at now. An event of a second that has left the
// window, which a late caller can bring, is dropped: it never overwrites a
// bucket of a later second.
func (c *counter) add(now time.Time) { c.addSec(uint64(uint32(now.Unix())), 1) }

// addSec counts n events in the second sec (Unix seconds, as uint32).
func (c *counter) addSec(sec, n uint64) {
	slot := &c[sec%budgetBuckets]
	for {
		old := slot.Load()
		var next uint64
		switch {
		case old>>32 == sec:
			next = old + n
		case old>>32 < sec:
			next = sec<<32 | n
		default:
			return
		}
		if slot.CompareAndSwap(old, next) {
			return
		}
	}
}

// sum is the count over the ten seconds up to now.
func (c *counter) sum(now time.Time) uint64 {
	sec := uint64(uint32(now.Unix()))
	var n uint64
	for i := range c {
		n += inWindow(c[i].Load(), sec)
	}
	return n
}

// lastSecond estimates the count over the second before now: this
// second's bucket, and the part of the last one that the second still
// covers.
func (c *counter) lastSecond(now time.Time) float64 {
	sec := uint64(uint32(now.Unix()))
	cur := c[sec%budgetBuckets].Load()
	prev := c[(sec+budgetBuckets-1)%budgetBuckets].Load()
	n := 0.0
	if cur>>32 == sec {
		n += float64(cur & math.MaxUint32)
	}
	if prev>>32 == sec-1 {
		frac := 1 - float64(now.Nanosecond())/1e9
		n += frac * float64(prev&math.MaxUint32)
	}
	return n
}

// inWindow returns a bucket's count if it belongs to the last ten seconds.
func inWindow(v, sec uint64) uint64 {
	if uint32(sec-v>>32) >= budgetBuckets {
		return 0
	}
	return v & math.MaxUint32
}

// lazyCounter is a counter whose events may come undated: the success
// path reads no clock to count its request (a reading costs as much as
// the rest of that path). Undated events wait in pending, in batches of
// at most undatedBatch: the first of a batch reads the clock for when the
// batch began, and the last reads it again and spreads the batch evenly
// over the time between, as do the readers (sum, lastSecond) and dated
// events when a batch is open. Steady traffic is counted as if each
// event were dated; a burst inside a batch is smoothed over the batch's
// time, at most undatedBatch-1 events of it, and never into a second
// before its first event.
type lazyCounter struct {
	counter
	pending atomic.Uint64 // undated events not yet spread
	began   atomic.Int64  // Unix nanoseconds of the open batch's first event
}

// undatedBatch is how many undated events wait for a clock reading at
// most: two readings every undatedBatch events.
const undatedBatch = 64

// add counts an event at now.
func (c *lazyCounter) add(now time.Time) {
	c.settle(now)
	c.counter.add(now)
}

// addUndated counts an event made now, reading clk only for the first and
// the last event of a batch. It returns that reading, when it made one:
// the caller may have a use for it (the time sweep of an unheld call).
func (c *lazyCounter) addUndated(clk Clock) (time.Time, bool) {
	switch n := c.pending.Add(1); {
	case n == 1:
		now := clk.Now()
		c.began.Store(now.UnixNano())
		return now, true
	case n >= undatedBatch:
		now := clk.Now()
		c.settle(now)
		return now, true
	}
	return time.Time{}, false
}

// sum is the count over the ten seconds up to now, undated events
// included.
func (c *lazyCounter) sum(now time.Time) uint64 {
	c.settle(now)
	return c.counter.sum(now)
}

// lastSecond estimates the count over the second before now, undated
// events included.
func (c *lazyCounter) lastSecond(now time.Time) float64 {
	c.settle(now)
	return c.counter.lastSecond(now)
}

// settle spreads the open batch of undated events evenly over the time
// from its first event to now, dropping the share of seconds that have
// left the window.
func (c *lazyCounter) settle(now time.Time) {
	if c.pending.Load() == 0 {
		return
	}
	from := c.began.Load()
	n := c.pending.Swap(0)
	if n == 0 {
		return
	}
	to := now.UnixNano()
	if from <= 0 || from > to {
		from = to
	}
	last, first := to/int64(time.Second), from/int64(time.Second)
	if last == first {
		c.addSec(uint64(uint32(last)), n)
		return
	}
	// Each second gets the share of the batch's time it holds: the count
	// of events up to a moment grows evenly from from to to.
	span := float64(to - from)
	upTo := func(at int64) uint64 { return uint64(float64(n) * float64(at-from) / span) }
	for sec := last; sec >= first && sec > last-budgetBuckets; sec-- {
		lo, hi := max(from, sec*int64(time.Second)), to
		if sec < last {
			hi = (sec + 1) * int64(time.Second)
		}
		k := upTo(hi) - upTo(lo)
		if sec == last {
			k = n - upTo(lo) // what rounding left goes to the newest second
		}
		if k > 0 {
			c.addSec(uint64(uint32(sec)), k)
		}
	}
}
