package retryhttp

import (
	"sync"
	"sync/atomic"
	"time"
)

// What the in-process limiter keeps of each host, and how it lets go of
// it. A host that never misbehaved has no entry and costs nothing. An
// entry is made when a host is parked, paced by configuration, or has a
// model (it failed, refused or announced a quota), and it is freed:
//
//   - by time: every sweepStep of the clock one request (whichever sees
//     the moment first, on any path, the success path included: one atomic
//     load of a time it already read) sweeps the next shard, so that every
//     shard is swept once per sweepEvery whether or not other hosts
//     arrive. An entry goes once its parking is over, its bucket full and
//     its model expired (forgotten: nothing heard of the host for
//     forgetAfter, or nothing gone wrong with it for as long): at most
//     forgetAfter + sweepEvery after the host was last heard of. No
//     goroutine runs it: a Transport that sends nothing keeps what it held
//     until its next request, or until it is dropped;
//   - under pressure: when a new entry brings its shard to its sweep mark,
//     which doubles after each such sweep (so its cost is constant per
//     entry added), a model quiet for sweepIdle goes too;
//   - and its map is made again, the survivors copied, when it has lost
//     most of its entries: Go maps never shrink.
//
// The entries are bounded: maxHosts in all, maxHosts/shardCount in each
// shard. A host met while its shard is full gets no entry: no model (it is
// healthy, as with WithLearning(false), and the retry budget bounds what
// its failures cost) and no parking of its own (the request that was told
// to wait waits; the others ask and are told again). What is held is kept
// rather than evicted for what is new: the held entries carry what was
// learned (a host down, a pace), a flood of new hosts would evict each
// other in turn and learn nothing, and refusing costs nothing while an
// eviction needs the oldest found. Time frees the room within seconds.
// The one exception is a configured pace (WithPace, WithHostPace), the
// user's word, which is kept whatever the bound: its entry has no model
// and is idle again within a burst's time.

// shardCount is how many locks the hosts are spread over.
const shardCount = 64

// maxHosts bounds the entries of the in-process limiter: 100,000 hosts, a
// crawler's worth of hosts failing at once, kept in some hundreds of MiB
// at most.
const maxHosts = 100_000

// sweepEvery is how long a round of the time sweep takes: each shard is
// swept once in it, one every sweepStep.
const (
	sweepEvery = 10 * time.Second
	sweepStep  = sweepEvery / shardCount
)

// fullSweepEvery is how often a shard near its bound is swept again for
// a new host when its last sweep left it over three quarters full: the
// hosts in between take the room left, and those refused cost nothing.
const fullSweepEvery = 500 * time.Millisecond

// minSweep is the map size below which a shard is never swept under
// pressure (time sweeps it all the same).
const minSweep = 64

// sweepIdle is how long a host's model must have been quiet for a sweep,
// under the pressure of memory, to forget it: a crawler meets a host, and
// moves on.
const sweepIdle = 3 * time.Second

// filterCells is the size of the limiter's host filter: with 1,000 hosts
// held, a host without an entry finds its cell empty nine times in ten.
const filterCells = 8192

type shard struct {
	mu        sync.Mutex
	hosts     map[string]*hostState
	sweepAt   int       // sweep idle hosts when the map reaches this size
	peak      int       // the most entries the map held since it was made
	fullUntil time.Time // the shard was full at its last sweep: none again until then
	_         [8]byte   // a cache line a shard
}

// hostState is what one host costs: under 100 bytes with its map entry,
// and its model once it failed, refused or announced a quota.
type hostState struct {
	// tat is the pace's theoretical arrival time (GCRA): the slot after
	// the last one given; until is when its parking ends (zero or past:
	// not parked). Both are instants of the limiter's epoch, as the
	// model's are: 8 bytes each, and a slot taken with integer sums.
	tat, until instant
	model      *hostModel // nil while the host is healthy
	cell       uint32     // the host's cell in the limiter's filter
	// dropped is set when the entry is forgotten: a Transport holding it
	// from its attempt's reservation looks the host up again.
	dropped bool
}

// hostFilter counts the entries of the hosts whose hash falls in each
// cell: a host whose cell is zero has no entry, and a request to it needs
// no lock however many other hosts hold one (a counting Bloom filter of
// one hash). Counted under each shard's lock, read without one.
type hostFilter [filterCells]atomic.Int32

// FNV-1a's 32-bit offset basis and prime, for hostHash and bareHash, which
// must agree.
const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

// hostHash is FNV-1a, inlined so that hashing a host allocates nothing.
func hostHash(host string) uint32 {
	h := uint32(fnvOffset)
	for i := 0; i < len(host); i++ {
		h ^= uint32(host[i])
		h *= fnvPrime
	}
	return h
}

// shardOf is the shard of a host's hash; cellOf its cell in the filter,
// from the bits the shard does not use.
func shardOf(h uint32) int   { return int(h % shardCount) }
func cellOf(h uint32) uint32 { return (h / shardCount) % filterCells }

// mayHold reports whether the host of hash h may have an entry: false
// means it has none, with one atomic load or two and no lock.
func (l *localLimiter) mayHold(h uint32) bool {
	f := l.filter.Load()
	return f != nil && f[cellOf(h)].Load() != 0
}

// tick runs the time sweep when its moment has come: the caller holds no
// shard's lock.
func (l *localLimiter) tick(now time.Time) { l.tickAt(now, now.Sub(l.epoch).Nanoseconds()) }

// tickAt is tick given now as nanoseconds since the epoch.
func (l *localLimiter) tickAt(now time.Time, ns int64) {
	if ns >= l.sweepDue.Load() {
		l.sweepSome(now, ns)
	}
}

// sweepSome sweeps the shards whose moment has come, one a sweepStep
// since the last (every shard after a quiet spell of sweepEvery), and sets
// the next moment: on the schedule, so that a round takes sweepEvery
// whatever the requests' spacing. Of the requests that see the moment at
// once, one sweeps.
func (l *localLimiter) sweepSome(now time.Time, ns int64) {
	due := l.sweepDue.Load()
	if ns < due {
		return
	}
	n := 1 + (ns-due)/int64(sweepStep)
	next := due + n*int64(sweepStep)
	if n > shardCount {
		n, next = shardCount, ns+int64(sweepStep)
	}
	if !l.sweepDue.CompareAndSwap(due, next) {
		return
	}
	for range n {
		s := &l.shards[l.sweepNext.Add(1)%shardCount]
		s.mu.Lock()
		s.sweep(l, now, false)
		s.mu.Unlock()
	}
}

// add makes a host's entry, first sweeping the shard when it reached its
// sweep mark: a host whose bucket is full again, whose parking is over and
// whose learned capacity has expired is indistinguishable from a new one,
// so forgetting it changes nothing. It returns nil, making nothing, when
// the shard is full, unless force says the entry is needed whatever the
// bound (a configured pace).
func (s *shard) add(l *localLimiter, host string, h uint32, now time.Time, force bool) *hostState {
	if n := len(s.hosts); n >= s.sweepAt && (n < l.perShard || !now.Before(s.fullUntil)) {
		s.sweep(l, now, true)
		if len(s.hosts) > l.perShard*3/4 {
			// Little room made: sweeping again at each new host would
			// cost the shard's size per host.
			s.fullUntil = now.Add(fullSweepEvery)
		}
	}
	if len(s.hosts) >= l.perShard && !force {
		return nil
	}
	if s.hosts == nil {
		s.hosts = make(map[string]*hostState)
	}
	st := &hostState{cell: cellOf(h)}
	s.hosts[host] = st
	if l.entries.Add(1) == 1 {
		l.heldSince.Store(now.Sub(l.epoch).Nanoseconds())
	}
	s.peak = max(s.peak, len(s.hosts))
	f := l.filter.Load()
	if f == nil {
		// Made with the first entry: a Transport whose hosts never
		// misbehave keeps none.
		l.filter.CompareAndSwap(nil, new(hostFilter))
		f = l.filter.Load()
	}
	f[st.cell].Add(1)
	return st
}

// sweep drops the shard's entries that can be forgotten at now (under
// pressure, models quiet for sweepIdle too), makes its map again when it
// has lost most of what it held, and sets its sweep mark. The caller holds
// the shard's lock.
func (s *shard) sweep(l *localLimiter, now time.Time, pressed bool) {
	for host, st := range s.hosts {
		if st.forgettable(now, l.at(now), pressed) {
			s.drop(l, host, st)
		}
	}
	switch n := len(s.hosts); {
	case n == 0:
		s.hosts, s.peak = nil, 0
	case n <= s.peak/4:
		// Go maps keep their buckets: only a new map gives them back.
		m := make(map[string]*hostState, n)
		for host, st := range s.hosts {
			m[host] = st
		}
		s.hosts, s.peak = m, n
	}
	s.sweepAt = min(max(minSweep, 2*len(s.hosts)), l.perShard)
}

// drop forgets a host's entry. The caller holds the shard's lock.
func (s *shard) drop(l *localLimiter, host string, st *hostState) {
	if st.model != nil {
		st.model.releaseAll()
		st.model = nil
		l.learning.Add(-1)
	}
	delete(s.hosts, host)
	st.dropped = true
	l.entries.Add(-1)
	l.filter.Load()[st.cell].Add(-1)
}

// forgettable reports whether a host's entry can be forgotten: not parked,
// its bucket full, and its model expired or, under the pressure of memory,
// quiet for sweepIdle with nothing in flight and not down.
func (st *hostState) forgettable(now time.Time, at instant, pressed bool) bool {
	if st.until.After(at) || st.tat.After(at) {
		return false
	}
	m := st.model
	return m == nil || m.expiredAt(at) || (pressed && at.Sub(m.seen) >= sweepIdle && m.inflight == 0 && m.state != HostDown)
}

// forgetAt is when the entry is forgotten at the latest if nothing more is
// heard of its host (the time sweep frees it within sweepEvery after).
func (st *hostState) forgetAt(epoch time.Time) time.Time {
	at := max(st.until, st.tat)
	if m := st.model; m != nil {
		at = max(at, m.seen.Add(forgetAfter))
	}
	return timeOf(epoch, at)
}
