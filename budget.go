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
// A Budget is safe for concurrent use. Recording a first try is lock free;
// only retries, which are rare, take a lock.
type Budget struct {
	ratio   uint64 // retries earned per first try, in millionths
	reserve uint64 // retries granted per window regardless, in millionths

	firsts [budgetBuckets]atomic.Uint64 // (second << 32) | count

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

// recordFirst counts a first try.
func (b *Budget) recordFirst(now time.Time) {
	sec := uint64(uint32(now.Unix()))
	slot := &b.firsts[sec%budgetBuckets]
	for {
		old := slot.Load()
		next := sec<<32 | 1
		if old>>32 == sec {
			next = old + 1
		}
		if slot.CompareAndSwap(old, next) {
			return
		}
	}
}

// tryRetry spends one retry if the window has one to give.
func (b *Budget) tryRetry(now time.Time) bool {
	sec := uint64(uint32(now.Unix()))
	var firsts uint64
	for i := range b.firsts {
		firsts += inWindow(b.firsts[i].Load(), sec)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var retries uint64
	for _, v := range b.retries {
		retries += inWindow(v, sec)
	}
	if (retries+1)*budgetScale > firsts*b.ratio+b.reserve {
		return false
	}
	slot := &b.retries[sec%budgetBuckets]
	if *slot>>32 == sec {
		*slot++
	} else {
		*slot = sec<<32 | 1
	}
	return true
}

// inWindow returns a bucket's count if it belongs to the last ten seconds.
func inWindow(v, sec uint64) uint64 {
	if uint32(sec-v>>32) >= budgetBuckets {
		return 0
	}
	return v & math.MaxUint32
}
