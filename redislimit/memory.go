package redislimit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/retryhttp/retryhttp"
	"golang.org/x/time/rate"
)

// memory is the in-process side of a Limiter: the pacer it falls back to
// while Redis does not answer, what Redis last said of each host (the
// shared bucket, the processes, the learned pace) for that pacer to go on
// from, and a mirror of the parkings this process set or heard of, so that
// a host parked stays parked for it whatever Redis does.
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
	// claimed holds the hosts this process holds a claim on, for the
	// keeper; its lock is taken after a shard's, never before.
	claimMu sync.Mutex
	claimed map[string]struct{}
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
	// key is prefix + host, the host's key in Redis, boxed once for the
	// reserve calls (see args.go); nil until the first.
	key    any
	tat    time.Time // the in-process bucket is full again at tat
	parked time.Time // parked until
	// own is tat as the in-process pacer left it: the slots it handed out
	// come before own, and Redis, when it answers again, must not hand out
	// the same moments to others.
	own time.Time

	// What the last answer from Redis said, for the in-process pacer to
	// continue from should Redis fail: the shared bucket's state projected
	// on the local clock (rtat, at answerAt), and whether the in-process
	// bucket has caught up with it since (synced). knownAt is when an
	// answer out of a lane last told of the bucket, laneAt when a lane
	// first answered since (Redis lost its data: the others' slots since
	// knownAt are not known).
	rtat, answerAt  time.Time
	knownAt, laneAt time.Time
	synced          bool
	// laneTo is the moment until which a call to Redis for the host is
	// sure to meet the lane the last answer told of (zero: none), as
	// answer.laneTo.
	laneTo time.Time
	// peak is the longest lead of the bucket an answer told in the second
	// to peakAt: the queue the others may have kept.
	peak   time.Duration
	peakAt time.Time
	// n and rank are the host's claims and this one's place among them, as
	// of the last recount, at hbAt; zero n: never heard. share is what
	// this process may pace at in process, 1/share of the pace, as its
	// claim holds: 1/n, or less when it joined others that had not heard
	// of it yet; zero: nothing.
	n, rank, share int
	hbAt           time.Time
	beatN          int // n as of this process's last recount
	// sub is the generation of the parking subscription when Redis last
	// answered for this host (see Limiter.heard).
	sub int64
	// lrate and lburst are the learned pace (0: none), from Redis or, while
	// Redis is away, learned in process; lhold is when the in-process
	// learner may cut it again.
	lrate  float64
	lburst int
	lhold  time.Time
	// told is set once this process told Redis what it sent, with its
	// first refusal from the host since it was last paced by nothing.
	told bool

	// This process's claim on a share of the host, as the last answer told
	// (see claimsLua): whether it holds one, the deadline it set on
	// Redis's clock (a goodbye gives back only that one, not a later
	// call's), and when it ends unless renewed. lease is the latest moment
	// the others may count this process as present, calling Redis: until
	// then they may take the whole pace, so a fall back to the in-process
	// pacer takes no slot before it.
	claim    bool
	deadline int64 // as held after the call Redis ran last, at heldAt on its clock
	heldAt   int64
	claimEnd time.Time
	lease    time.Time
	// lastCall is when this process last called Redis for the host, gap
	// its gap between wants of the host lately (with a Cluster, between calls; see prepare), dl the time its last call gave it to
	// call again, demand when it last wanted a slot (in process or not),
	// local that it paced the host in process since its last answer.
	lastCall, demand time.Time
	gap, dl          time.Duration
	local            bool
	// slots is when the last slot Redis gave this process for the host
	// comes: a request waiting for it still wants the host. pend holds
	// the slots from Redis still to come, earliest first (pendMax at
	// most), passed the latest of those that came, and wgap the gap
	// between one of them coming and the next want (see prepare).
	slots  time.Time
	pend   []time.Time
	passed time.Time
	wgap   time.Duration
	// waited: the process waited for Redis, holding no claim on the host
	// (it never reached Redis for it, or gave its share back). orphan: it
	// held a claim that Redis has lost since (a restart, a flush), and
	// still has that share until it holds a claim again.
	waited, orphan bool
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

// share is how the in-process pacer divides a host's pace with the other
// processes while Redis is away.
type share struct {
	fixed  int       // WithFallbackShare: this many processes, whatever Redis said
	peers  int       // processes known to Redis lately, for a host never heard of
	downAt time.Time // when Redis failed; zero while it answers
	// claimed: a share needs a claim that Redis counted; without one the
	// process waits for Redis, asking again at retry. stall: no slot
	// before the claim's lease ends (the server is away; not so when the
	// processes all pace in process, coming back from an outage).
	claimed, stall bool
	retry          time.Time
}

// reserve is Limiter.Reserve in process, at the pace p or the learned one
// when slower, of which this process takes its share: 1/n of the rate,
// 1/n of the burst (at least 1), n being the host's claims as the last
// answer told. Its first slot after an answer from Redis comes no earlier
// than the shared bucket allows, nor before the others can have stopped
// counting this process as present, and is staggered by this process's
// rank, so that the processes' slots interleave as Redis would have
// handed them out and the switch brings no burst. A process holding no
// claim on the host has no share of it to take: the others may be taking
// the whole pace, so it waits for Redis.
func (m *memory) reserve(a retryhttp.Attempt, p retryhttp.Pace, sh share) retryhttp.Reservation {
	s := m.shard(a.Host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[a.Host]
	if h != nil && h.parked.After(a.Now) {
		return retryhttp.Reservation{ParkedUntil: h.parked}
	}
	if h != nil && h.lrate > 0 {
		p = minPace(p, retryhttp.Pace{Limit: rate.Limit(h.lrate), Burst: max(h.lburst, 1)})
	}
	if p.Unlimited() {
		return retryhttp.Reservation{OK: true}
	}
	if sh.claimed && (h == nil || (!h.claim && !h.orphan) || h.share == 0 || !a.Now.Before(h.claimEnd)) {
		if h == nil {
			h = s.get(a.Host, a.Now)
		}
		h.demand, h.waited = a.Now, true
		if !a.Latest.IsZero() && sh.retry.After(a.Latest) {
			return retryhttp.Reservation{Delay: sh.retry.Sub(a.Now)}
		}
		return retryhttp.Reservation{AskAgain: sh.retry}
	}
	if h == nil {
		h = s.get(a.Host, a.Now)
	}
	h.demand = a.Now
	n, rank := sh.fixed, h.rank
	if n <= 0 && sh.claimed {
		n = h.share
	}
	if n <= 0 {
		n = h.n
		if n <= 0 {
			n, rank = sh.peers, 0
		}
	}
	n = max(n, 1)
	rank = min(rank, n-1)
	shared, burst := gcra(p)
	interval := time.Duration(n) * shared
	burst = max(1, burst/n)
	tolerance := time.Duration(burst-1) * interval
	if !h.synced && !h.answerAt.IsZero() {
		// The shared bucket as Redis last said, moved on by what the
		// others may have taken before Redis failed or lost its data:
		// they keep it as far ahead of the clock as it was lately, a
		// second's worth at most.
		start := h.rtat
		lost := sh.downAt
		if lost.IsZero() {
			lost = h.laneAt
		}
		if n > 1 && lost.After(h.knownAt) {
			move := min(lost.Sub(h.knownAt), time.Second)
			start = h.knownAt.Add(move + max(h.rtat.Sub(h.knownAt), h.peak))
		}
		if start.After(h.tat) {
			h.tat = start
		}
		h.synced = true
	}
	tat := h.tat
	if tat.Before(a.Now) {
		tat = a.Now
	}
	if floor := h.lease.Add(tolerance); sh.stall && tat.Before(floor) {
		tat = floor
	}
	slot := tat.Add(-tolerance)
	if slot.Before(a.Now) {
		slot = a.Now
	}
	if n > 1 && h.n > 0 {
		// Each process takes only the slots of its place in the round,
		// counted on the wall clock from the Unix epoch: the processes'
		// slots interleave however each came to pace in process. The
		// bucket moves on with the slot.
		grid := onGrid(slot, shared, n, rank)
		tat = tat.Add(grid.Sub(slot))
		slot = grid
	}
	wait := slot.Sub(a.Now)
	if !a.Latest.IsZero() && slot.After(a.Latest) {
		return retryhttp.Reservation{Delay: wait}
	}
	h.tat = tat.Add(interval)
	h.own = h.tat
	h.local = true
	raise(&m.ownMax, h.own.UnixNano())
	r := retryhttp.Reservation{OK: true, Delay: wait}
	if wait > 0 {
		host, mine := a.Host, h.tat
		r.Cancel = func(time.Time) { m.cancel(host, mine, interval) }
	}
	return r
}

// hasShare reports whether the in-process pacer has a share of host to
// pace at now, as memory.reserve finds it: a claim (or an orphan's
// share) that Redis counted and that has not ended. A host without one
// waits for Redis.
func (m *memory) hasShare(host string, now time.Time) bool {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	return h != nil && (h.claim || h.orphan) && h.share > 0 && now.Before(h.claimEnd)
}

// onGrid returns the first moment from t on that is the slot of place
// rank in rounds of n slots of length interval, counted from the Unix
// epoch.
func onGrid(t time.Time, interval time.Duration, n, rank int) time.Time {
	round := int64(interval) * int64(n)
	off := t.UnixNano() - int64(rank)*int64(interval)
	k := off / round
	if k*round < off {
		k++
	}
	return time.Unix(0, k*round+int64(rank)*int64(interval))
}

// minPace is the slower of two paces, rate and burst each, as the core's
// Pace.min.
func minPace(p, q retryhttp.Pace) retryhttp.Pace {
	switch {
	case q.Unlimited():
		return p
	case p.Unlimited():
		return q
	}
	return retryhttp.Pace{Limit: min(p.Limit, q.Limit), Burst: min(p.Burst, q.Burst)}
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

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// answer is what an answer from Redis says of a host, for memory.heard.
type answer struct {
	at    time.Time     // when it arrived, on the Transport's clock
	lead  time.Duration // how far ahead of Redis's now the shared bucket is
	n     int           // claims counted, 0 when none
	rank  int           // this process's place among them, -1 when this call did not recount
	rate  float64       // the learned pace, 0 for none
	burst int
	sub   int64 // the subscription's generation when it arrived
	lane  bool  // processes are coming back from an outage (codeLane)
	// laneTo, for a lane, is the latest moment a call may be sent and
	// still meet it, on the Transport's clock.
	laneTo time.Time
	// began, for a lane, is when the server's data began (its epoch), on
	// the Transport's clock; zero when not known (a Cluster).
	began time.Time
	// check: the answer to a check for a parking after a wait, which the
	// script answers before it looks at the bucket, the claims or a lane
	// (see reserveLua).
	check bool
	// claim is this process's claim's deadline, in µs of Redis's clock,
	// whose now the answer told (redisNow): -1 when it holds none, -2
	// when the call did not look. share is the claim's share, 1/share of
	// the pace, to pace at in process (0: none).
	claim, redisNow int64
	share           int
}

// heard records an answer from Redis about host, and reports whether it
// gave this process a claim it did not hold. It keeps nothing for a host
// that is neither paced, learned nor counted: an unpaced host costs no
// memory.
func (m *memory) heard(host string, a answer) bool {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil {
		if a.lead <= 0 && a.n == 0 && a.rank < 0 && a.rate == 0 && a.claim < 0 {
			return false
		}
		h = s.get(host, a.at)
	}
	if a.check {
		// A check knows nothing of a lane: taken for an answer out of one,
		// it told the in-process pacer that the bucket was known just now,
		// and the lane's next answer moved that pacer on by the others'
		// queue as if Redis had lost it since (up to 0.6 s at 20/s), and
		// ended the pacing in process (TestBucketOutlivesData lost a
		// process's slots for 0.6-0.9 s so after a restart).
		h.sub, h.lrate, h.lburst = a.sub, a.rate, a.burst
		return false
	}
	// What this process knew of the bucket stands though Redis lost it
	// (a flush, a restart): the slots it saw handed out are not handed
	// out again. Only a cancel of its own moves it back (gaveBack).
	// In a lane the bucket holds the slots handed out in process, this
	// process's among them, which it knows better.
	if rt := a.at.Add(a.lead); rt.After(h.rtat) && !a.lane {
		h.rtat = rt
	}
	h.answerAt, h.synced, h.sub = a.at, false, a.sub
	h.laneTo = a.laneTo
	switch {
	case !a.lane:
		h.knownAt, h.laneAt = a.at, time.Time{}
		if a.lead >= h.peak || a.at.Sub(h.peakAt) >= time.Second {
			h.peak, h.peakAt = a.lead, a.at
		}
	case h.laneAt.IsZero():
		h.laneAt = a.at
		if a.began.After(h.knownAt) && a.began.Before(h.laneAt) {
			// Redis lost its data (a restart, a flush) before its data
			// began, after the last answer out of a lane, and has handed
			// out no slot since but in lanes: the others' slots since
			// knownAt were taken before then. A process whose requests
			// all waited for slots Redis gave before the loss comes to
			// the lane only once the first has come, up to the others'
			// queue (0.6 s at 20/s) after the loss; moved on from that
			// moment, its in-process bucket started as late again after
			// the old one's end (TestBucketOutlivesData).
			h.laneAt = a.began
		}
	}
	if a.n > 0 && (!a.lane || a.n > h.n) {
		// Coming back from an outage, a restarted Redis counts the
		// processes afresh as they come back: until then, those not back
		// yet still pace at the share they had.
		h.n = a.n
	}
	if a.rank >= 0 && (!a.lane || a.n >= h.n) {
		h.rank, h.hbAt, h.beatN = a.rank, a.at, a.n
	}
	h.lrate, h.lburst = a.rate, a.burst
	if h.lastCall.IsZero() {
		h.lastCall = a.at
	}
	had := h.claim
	h.heardClaim(a)
	if h.claim != had {
		m.setClaimed(host, h.claim)
	}
	return h.claim && !had
}

// heardClaim records what an answer says of this process's claim on the
// host. An answer out of a lane ends the pacing in process; one that
// finds the claim gone (Redis lost it, or it ended while the process was
// cut off) leaves the process its share, an orphan, until it holds a
// claim again: it paces that share in process while the processes come
// back and count themselves afresh.
func (h *memHost) heardClaim(a answer) {
	if a.claim == -1 && h.claim {
		h.orphan = true
	}
	if !a.lane {
		h.local = false
	}
	if a.claim == -2 {
		return // the call did not look
	}
	h.claim = a.claim >= 0
	if !h.claim {
		return
	}
	h.waited, h.orphan = false, false
	// In a lane the claims are being counted afresh, and a share the
	// process had may show as less, or none, until the others have come
	// back: it keeps the share it had, or a smaller one.
	if !a.lane || a.share > h.share {
		h.share = a.share
	}
	// The deadline may lie in the past: a claim not renewed (a call that
	// came late, a lane) is away already. Answers may arrive in another
	// order than Redis ran their calls: the deadline held is the one of
	// the call run last, which a goodbye must name.
	lead := time.Duration(a.claim-a.redisNow) * time.Microsecond
	if a.redisNow >= h.heldAt {
		h.deadline, h.heldAt, h.claimEnd = a.claim, a.redisNow, a.at.Add(lead+awayFor)
	}
	if end := a.at.Add(max(lead, 0)); end.After(h.lease) {
		h.lease = end
	}
}

// prep is what a call to Redis for a host carries of this process's
// knowledge of it.
type prep struct {
	key   any           // the host's key, boxed once (nil: not known yet)
	ahead time.Duration // how far ahead the bucket is known to be full
	dl    time.Duration // until the process calls again, if it still wants the host

	beat  bool // recount the claims: the process's place may have moved
	had   bool // the process paced the host in process on its claim, or Redis lost it
	knew  bool // it holds a claim, as far as it knows
	share int  // the share it paces at in process, 1/share; 0: none
	// waited: it waited for Redis, holding no claim on the host.
	waited bool
}

// prepare returns what a call for host at now carries, and records the
// call. The bucket is known to be full as far as Redis last told it: a
// server that lost its data since gets it back. The claim's deadline
// gives the process twice its recent gap between calls to call again, or
// the bucket's lead when longer: a process whose requests all wait for
// their slots calls again when the first of them has gone.
//
// With wants, the gap is between the process's wants of the host, not
// between its calls to Redis: a process back from pacing in process calls
// after a gap as long as its fallback, and a deadline twice that would
// hold its share back for as long at its next fall. Without (a Cluster,
// whose calls carry no bound past which they are refused, and may renew
// a claim however late they run), the gap between calls is kept, whose
// longer deadlines cover such late renewals better.
func (m *memory) prepare(host, prefix string, now time.Time, paced, wants bool) prep {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil {
		return prep{beat: paced, dl: presenceFloor}
	}
	if h.key == nil {
		h.key = prefix + host
	}
	p := prep{key: h.key, had: h.orphan || (h.local && h.claim), knew: h.claim, waited: h.waited && !h.claim, share: h.share}
	// A count that changed since this process's last recount may have
	// moved its place: recount to learn it.
	p.beat = h.n != h.beatN || now.Sub(h.hbAt) >= heartbeatEvery || now.Before(h.hbAt)
	// Not the slots handed out in process: they are this process's share,
	// which Redis counts as away until they have passed (see
	// Limiter.Reserve), and lie only on its places in the round.
	lead := min(max(h.rtat.Sub(now), 0), aheadFloor)
	p.ahead = lead
	last := h.lastCall
	if wants {
		last = later(last, h.demand)
	}
	k := 0
	for k < len(h.pend) && !h.pend[k].After(now) {
		h.passed = later(h.passed, h.pend[k])
		k++
	}
	h.pend = h.pend[:copy(h.pend, h.pend[k:])]
	if g := now.Sub(last); !h.lastCall.IsZero() && g >= 0 {
		h.gap = min(max(g, h.gap/2), presenceMax)
		if wants {
			w := now.Sub(later(last, h.passed))
			h.wgap = min(max(w, h.wgap/2), presenceMax)
		}
	}
	h.lastCall, h.demand = now, now
	p.dl = max(min(max(2*h.gap, presenceFloor), presenceMax), lead)
	// The keeper gives the claim back by the longer time: a process
	// whose requests wait for slots in process (a lane after a loss of
	// Redis's data) calls again only once they have passed, and with the
	// claim given back it would wait for Redis, holding no share
	// (TestBucketOutlivesData).
	h.dl = p.dl
	if wants && len(h.pend) > 0 {
		// A process whose requests wait for their slots wants the host
		// again as the first of them comes: the gap between its bunches
		// of wants is time spent waiting for its own slots, and counted
		// (twice) in the deadline it held the claim present, and so held
		// back the first slot in process at a fall, 0.9 s after a call
		// at a third of 20/s with four requests waiting
		// (TestLinkNearTimeout), where its next want came within 0.45 s.
		// Never longer than before.
		p.dl = min(p.dl, h.pend[0].Sub(now)+max(2*h.wgap, presenceFloor))
	}
	return p
}

// gaveBack records that Redis took back a slot of host that this process
// cancelled: the bucket it knows of is one interval less full.
func (m *memory) gaveBack(host string, interval time.Duration) {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil {
		h.rtat = h.rtat.Add(-interval)
	}
}

// subGen returns the subscription generation of host's last answer, 0 when
// none.
func (m *memory) subGen(host string) int64 {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil {
		return h.sub
	}
	return 0
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
// over, and not heard of from Redis lately (what it said of the other
// processes and of a learned pace would be lost). A zero now sweeps
// nothing: sweeping as of a later moment than the present would drop hosts
// still parked or paced.
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
			if !h.tat.After(now) && !h.parked.After(now) && !h.own.After(now) && !h.claim &&
				now.Sub(h.answerAt) >= 3*heartbeatEvery && (h.lrate == 0 || now.Sub(h.answerAt) >= learnTTL) {
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
