package retryhttp

import "time"

// sliding counts events over the last second in two one-second bins: the
// current one whole, and the share of the last that the second still
// covers.
type sliding struct {
	start     instant // the current bin's start
	cur, prev float32 // whole counts: exact in a float32 up to 2^24 a second
}

func (s *sliding) roll(now instant) {
	switch d := now.Sub(s.start); {
	case d < time.Second:
	case d < 2*time.Second:
		s.start, s.prev, s.cur = s.start.Add(time.Second), s.cur, 0
	default:
		s.start, s.prev, s.cur = now, 0, 0
	}
}

func (s *sliding) add(now instant) {
	s.roll(now)
	s.cur++
}

func (s *sliding) lastSecond(now instant) float64 {
	s.roll(now)
	return float64(s.cur) + float64(s.prev)*(1-float64(now.Sub(s.start))/float64(time.Second))
}

// twoSeconds keeps the largest value seen this second and the last.
type twoSeconds struct {
	start     instant
	cur, prev int32
}

func (w *twoSeconds) roll(now instant) {
	switch d := now.Sub(w.start); {
	case d < time.Second:
	case d < 2*time.Second:
		w.start, w.prev, w.cur = w.start.Add(time.Second), w.cur, 0
	default:
		w.start, w.prev, w.cur = now, 0, 0
	}
}

func (w *twoSeconds) add(now instant, v int) {
	w.roll(now)
	w.cur = max(w.cur, int32(v))
}

func (w *twoSeconds) max(now instant) int32 {
	w.roll(now)
	return max(w.cur, w.prev)
}

// latencies keeps a host's recent answer latencies, for its 95th
// percentile: the last 64, in a ring; the percentile is worked out again
// every eighth answer.
type latencies struct {
	ring   [64]time.Duration
	n      int
	next   int
	fresh  int // answers since the percentile was worked out
	cached time.Duration
}

func (ls *latencies) add(d time.Duration) {
	ls.ring[ls.next] = d
	ls.next = (ls.next + 1) % len(ls.ring)
	ls.n = min(ls.n+1, len(ls.ring))
	ls.fresh++
}

// known reports whether any latency is kept.
func (ls *latencies) known() bool { return ls != nil && ls.n > 0 }

// p95 is the 95th percentile of the latencies kept; 0 when none.
func (ls *latencies) p95() time.Duration {
	if !ls.known() {
		return 0
	}
	if ls.cached > 0 && ls.fresh < 8 {
		return ls.cached
	}
	ls.fresh, ls.cached = 0, ls.percentile95()
	return ls.cached
}

func (ls *latencies) percentile95() time.Duration {
	var sorted [64]time.Duration
	s := sorted[:ls.n]
	copy(s, ls.ring[:ls.n])
	// Insertion sort: 64 values at most, and no allocation.
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[(len(s)*95+99)/100-1]
}
