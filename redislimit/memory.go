package redislimit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryhttp/retryhttp"
)

// memory is the in-process side of a Limiter: the pacer it falls back to
// while Redis does not answer, and a mirror of the parkings this process
// set, so that a host it parked stays parked for it whatever Redis does.
// It does the same GCRA as the script, on the Transport's clock
// (Attempt.Now). Hosts live in shards so that unrelated hosts do not wait
// on one lock, and idle hosts are dropped when a shard doubles, as in the
// core's own pacer.
type memory struct {
	// parkedMax is the latest parking end ever set, in Unix nanoseconds:
	// while now is past it, no host is parked and no lock is taken.
	parkedMax atomic.Int64
	// ownMax is the latest memHost.own ever set, in Unix nanoseconds:
	// while now is past it, no host has slots of its own still to come.
	ownMax atomic.Int64
	shards [memShards]memShard
}

const (
	memShards = 32
	memSweep  = 64 // a shard smaller than this is never swept
)

type memShard struct {
	mu      sync.Mutex
	hosts   map[string]*memHost
	sweepAt int
}

type memHost struct {
	tat    time.Time // the bucket is full again at tat
	parked time.Time // parked until
	// own is tat as the in-process pacer left it: the slots it handed out
	// come before own, and Redis, when it answers again, must not hand out
	// the same moments to others.
	own time.Time
}

// parkedUntil returns the end of host's parking when it is parked at now.
func (m *memory) parkedUntil(host string, now time.Time) (time.Time, bool) {
	if now.UnixNano() >= m.parkedMax.Load() {
		return time.Time{}, false
	}
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil && h.parked.After(now) {
		return h.parked, true
	}
	return time.Time{}, false
}

// park records a parking; an earlier end never shortens a later one.
func (m *memory) park(host string, until time.Time) {
	s := m.shard(host)
	s.mu.Lock()
	h := s.get(host, time.Time{}) // the time is not known here: no sweep
	if until.After(h.parked) {
		h.parked = until
	}
	s.mu.Unlock()
	raise(&m.parkedMax, until.UnixNano())
}

// reserve is Limiter.Reserve in process, at the pace p.
func (m *memory) reserve(a retryhttp.Attempt, p retryhttp.Pace) retryhttp.Reservation {
	if p.Unlimited() {
		if until, ok := m.parkedUntil(a.Host, a.Now); ok {
			return retryhttp.Reservation{ParkedUntil: until}
		}
		return retryhttp.Reservation{OK: true}
	}
	interval, burst := gcra(p)
	s := m.shard(a.Host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.get(a.Host, a.Now)
	if h.parked.After(a.Now) {
		return retryhttp.Reservation{ParkedUntil: h.parked}
	}
	tat := h.tat
	if tat.Before(a.Now) {
		tat = a.Now
	}
	wait := max(0, tat.Sub(a.Now)-time.Duration(burst-1)*interval)
	if !a.Latest.IsZero() && a.Now.Add(wait).After(a.Latest) {
		return retryhttp.Reservation{Delay: wait}
	}
	h.tat = tat.Add(interval)
	h.own = h.tat
	raise(&m.ownMax, h.own.UnixNano())
	r := retryhttp.Reservation{OK: true, Delay: wait}
	if wait > 0 {
		host, mine := a.Host, h.tat
		r.Cancel = func(time.Time) { m.cancel(host, mine, interval) }
	}
	return r
}

// cancel gives back the slot whose reservation left host's bucket at mine,
// if no slot was taken after it (see cancelScript).
func (m *memory) cancel(host string, mine time.Time, interval time.Duration) {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil && h.tat.Equal(mine) {
		h.tat = h.tat.Add(-interval)
		if h.own.Equal(mine) {
			h.own = h.tat
		}
	}
}

// horizon returns how far beyond now the slots that the in-process pacer
// handed out for host reach; zero when they are all past.
func (m *memory) horizon(host string, now time.Time) time.Duration {
	if now.UnixNano() >= m.ownMax.Load() {
		return 0
	}
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil {
		return max(0, h.own.Sub(now))
	}
	return 0
}

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// follow records that Redis granted this process a slot at the given moment,
// so that a switch to the in-process pacer continues from there instead of
// from a full bucket. interval is the in-process pacer's.
func (m *memory) follow(host string, now, slot time.Time, interval time.Duration) {
	s := m.shard(host)
	s.mu.Lock()
	h := s.get(host, now)
	if next := slot.Add(interval); next.After(h.tat) {
		h.tat = next
	}
	s.mu.Unlock()
}

// parkings returns the parkings that last beyond now, for handing to Redis
// when it answers again.
func (m *memory) parkings(now time.Time) map[string]time.Time {
	if now.UnixNano() >= m.parkedMax.Load() {
		return nil
	}
	out := make(map[string]time.Time)
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		for host, h := range s.hosts {
			if h.parked.After(now) {
				out[host] = h.parked
			}
		}
		s.mu.Unlock()
	}
	return out
}

func (m *memory) shard(host string) *memShard {
	// FNV-1a, inlined so that hashing a host allocates nothing.
	h := uint32(2166136261)
	for i := 0; i < len(host); i++ {
		h ^= uint32(host[i])
		h *= 16777619
	}
	return &m.shards[h%memShards]
}

// get returns host's entry, making it if needed; a new entry may first
// sweep out the hosts idle at now, those whose bucket is full and parking
// over. A zero now sweeps nothing: sweeping as of a later moment than the
// present would drop hosts still parked or paced.
func (s *memShard) get(host string, now time.Time) *memHost {
	if h := s.hosts[host]; h != nil {
		return h
	}
	if s.hosts == nil {
		s.hosts = make(map[string]*memHost)
		s.sweepAt = memSweep
	}
	if len(s.hosts) >= s.sweepAt && !now.IsZero() {
		for k, h := range s.hosts {
			if !h.tat.After(now) && !h.parked.After(now) && !h.own.After(now) {
				delete(s.hosts, k)
			}
		}
		s.sweepAt = max(memSweep, 2*len(s.hosts))
	}
	h := &memHost{}
	s.hosts[host] = h
	return h
}

// Bounds on a pace, as in the core's WithPace: an interval of an hour and
// a burst of a million at most keep interval × burst well inside a Duration
// and inside the 2^53 microseconds a Lua number holds exactly.
const (
	maxInterval = time.Hour
	maxBurst    = 1_000_000
)

// gcra returns the interval between slots and the burst of a pace that is
// not unlimited. The interval is rounded up to a whole microsecond, the
// unit of the Redis script, so both pacers agree and neither runs fast.
func gcra(p retryhttp.Pace) (time.Duration, int) {
	us := float64(time.Second/time.Microsecond) / float64(p.Limit)
	const maxUS = float64(maxInterval / time.Microsecond)
	var interval time.Duration
	switch {
	case !(us < maxUS): // also NaN
		interval = time.Duration(maxUS) * time.Microsecond
	case us <= 1:
		interval = time.Microsecond
	default:
		n := time.Duration(us)
		if float64(n) < us {
			n++
		}
		interval = n * time.Microsecond
	}
	return interval, min(max(p.Burst, 1), maxBurst)
}
