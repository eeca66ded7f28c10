package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// ErrHostPaused is the errors.Is target for a request that failed at once
// because its host is parked: a server asked for a wait longer than the
// Transport's Retry-After max, or longer than the request's context allows.
var ErrHostPaused = errors.New("retryhttp: host paused")

// HostPausedError is the detail behind ErrHostPaused: which host, and until
// when. errors.Is(err, ErrHostPaused) reports true for it.
type HostPausedError struct {
	Host  string
	Until time.Time
}

// Error names the host and the moment it reopens.
func (e *HostPausedError) Error() string {
	return fmt.Sprintf("retryhttp: host %s paused until %s", e.Host, e.Until.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrHostPaused.
func (e *HostPausedError) Unwrap() error { return ErrHostPaused }

// Pace is a per-host rate: Limit attempts a second on average, Burst of them
// at once. A Limit of zero, rate.Inf, negative or NaN means no pace.
type Pace struct {
	Limit rate.Limit
	Burst int
}

// Unlimited reports whether p paces nothing.
func (p Pace) Unlimited() bool {
	return !(p.Limit > 0) || p.Limit == rate.Inf
}

// min is the slower of two paces, burst and rate each.
func (p Pace) min(q Pace) Pace {
	switch {
	case q.Unlimited():
		return p
	case p.Unlimited():
		return q
	}
	return Pace{Limit: min(p.Limit, q.Limit), Burst: min(p.Burst, q.Burst)}
}

// interval is the time between two slots; newPace keeps it within an hour.
func (p Pace) interval() time.Duration {
	return time.Duration(float64(time.Second) / float64(p.Limit))
}

// Attempt is what a Transport asks a Limiter before each try to a host.
type Attempt struct {
	Host   string    // host[:port], lower case, without the scheme's default port
	Pace   Pace      // the pace configured for Host; the Limiter may pace slower, never faster
	Now    time.Time // the Transport's clock
	Latest time.Time // the attempt must start by then (the request's deadline); zero: no bound
	// CheckOnly asks whether the host is parked, taking no slot: the
	// attempt already has one, and waited for it.
	CheckOnly bool
	// Waited is the Wait of the Reservation before, once it closed: a
	// Limiter that keeps a freed slot in flight for the first of those
	// waiting hands it over now. The in-process one does, so that no
	// request waits behind those that came after it. Nil otherwise.
	Waited <-chan struct{}
}

// Reservation is a Limiter's answer.
type Reservation struct {
	// OK is true when a slot was taken: the attempt starts after Delay.
	OK bool
	// Delay is the wait from Attempt.Now until the slot.
	Delay time.Duration
	// ParkedUntil is non-zero when the host is parked: nothing was taken,
	// and the caller may ask again once it has waited until then.
	ParkedUntil time.Time
	// AskAgain is non-zero when nothing was taken because the host's
	// slots are handed out no further ahead than a short horizon (its pace
	// is learned, and may change): the caller waits until then and asks
	// again.
	AskAgain time.Time
	// Cancel, when non-nil, gives the slot back: the Transport calls it
	// when the request's context ends before the slot comes, so that a
	// cancelled request does not hold up the ones behind it.
	Cancel func(now time.Time)
	// Down is set when the host is down: nothing was taken, and the
	// Transport hands the request back at once with this error.
	Down *HostDownError
	// Wait, when non-nil, says nothing was taken because the host's limit
	// on attempts in flight is reached: the caller waits until it is
	// closed, then asks again with Attempt.Waited set to it; it calls
	// Cancel, when set, if it stops waiting first.
	Wait <-chan struct{}
	// Report asks for the attempt's answer, whatever it is, through Learn,
	// with Ticket in the Signal: the Limiter keeps count of the host.
	Report bool
	Ticket uint64
}

// Limiter paces attempts per host, holds each host's parking and keeps
// each host's model (model.go): whether it is failing, overloaded or
// down, and how it is held. The Transport asks it before every attempt,
// tells it of every parking, and of every answer of an attempt it asked to
// hear of and of every answer that failed or announced a quota. The
// default is an in-process limiter owned by the Transport; WithLimiter
// installs another, such as redislimit's, which shares them across
// processes. A Limiter must be safe for concurrent use and must not block
// beyond ctx.
type Limiter interface {
	// Reserve takes one attempt's slot to a.Host at a.Pace or slower (a
	// learned pace), unless the host is parked (ParkedUntil set, nothing
	// taken), down (Down set), at its limit in flight (Wait set), or the
	// slot would come after a.Latest (OK false, nothing taken). An error
	// means the limiter itself failed; the Transport returns it without
	// sending.
	Reserve(ctx context.Context, a Attempt) (Reservation, error)
	// Park closes host to every caller until the given moment. A moment
	// earlier than an existing parking does not shorten it.
	Park(ctx context.Context, host string, until time.Time) error
	// Learn records what an answer from host says of it and returns the
	// host's status. A Signal with a Ticket answers the attempt that
	// Reserve gave it to, even when Canceled (the attempt was never sent,
	// or its caller gave up): the Transport gives back every ticket once.
	// A Limiter that learns nothing returns the zero HostStatus (healthy,
	// unlimited).
	Learn(ctx context.Context, host string, s Signal) (HostStatus, error)
}

// localLimiter is the default Limiter. Hosts live in shards, so unrelated
// hosts never wait on one lock; a request to an unpaced host touches no lock
// at all while nothing is parked or modelled, nor, whatever other hosts
// hold, while it has no entry (sweep.go keeps the entries, and frees them).
type localLimiter struct {
	// parkedUntil is the end of the latest parking ever set, as monotonic
	// nanoseconds since epoch: while now is past it, no host is parked.
	parkedUntil atomic.Int64
	// learning counts the hosts with a model: while it is zero, no host is
	// paced but by configuration, and none needs counting.
	learning atomic.Int64
	gens     atomic.Uint32 // numbers each model, so that its tickets are its own
	// freshUntil is when the newest model is a hold old, as monotonic
	// nanoseconds since epoch: until then, answers of attempts sent before
	// it are told to it.
	freshUntil atomic.Int64
	// sweepDue is when the next shard is swept for what time made idle,
	// as monotonic nanoseconds since epoch; sweepNext counts the shards
	// swept, the next one's index (sweep.go).
	sweepDue  atomic.Int64
	sweepNext atomic.Uint32
	// entries counts the hosts that hold an entry (a parking, a pace, a
	// model): while it is zero, the success path reads no clock (calm).
	// heldSince is when it last became non-zero, as monotonic nanoseconds
	// since epoch: an attempt sent while it was zero was sent before.
	entries   atomic.Int64
	heldSince atomic.Int64
	// filter tells a host without an entry without a lock, made with the
	// first entry; perShard is the most entries a shard holds (maxHosts).
	filter   atomic.Pointer[hostFilter]
	perShard int
	epoch    time.Time
	clock    Clock        // for Park, which is told no time but must sweep by it
	logger   *slog.Logger // one line when a host's state or learned pace changes much
	shards   [shardCount]shard
}

func newLocalLimiter(clk Clock) *localLimiter {
	l := &localLimiter{clock: clk, epoch: clk.Now(), perShard: maxHosts / shardCount}
	l.sweepDue.Store(int64(sweepStep))
	return l
}

// quiet reports, with two atomic loads, that no host is parked at now nor
// paced by what was learned; with a third, it runs the time sweep when
// its moment has come (sweep.go), on the clock reading the caller has.
func (l *localLimiter) quiet(now time.Time) bool {
	return l.quietAt(now, now.Sub(l.epoch).Nanoseconds())
}

// quietAt is quiet given now as nanoseconds since the epoch.
func (l *localLimiter) quietAt(now time.Time, ns int64) bool {
	if ns >= l.sweepDue.Load() {
		l.sweepSome(now, ns)
	}
	return l.learning.Load() == 0 && ns >= l.parkedUntil.Load()
}

func (l *localLimiter) Reserve(_ context.Context, a Attempt) (Reservation, error) {
	var res Reservation
	l.reserve(&a, 0, nil, &res)
	return res, nil
}

// reserve is Reserve given the host's hash when the caller has one (0:
// not made yet), so that a request hashes its host once, and the entry an
// earlier attempt of the request was given (nil: none), which the lookup
// would find again unless it was dropped since. It returns the host's
// entry with a slot that asks for a report: its Transport hands it back
// with the answer (learn), which then needs no lookup either.
func (l *localLimiter) reserve(a *Attempt, h uint32, hint *hostState, res *Reservation) *hostState {
	d := a.Now.Sub(l.epoch) // one subtraction for the sweep's moment and the model's instant
	if a.Pace.Unlimited() && l.quietAt(a.Now, d.Nanoseconds()) {
		*res = Reservation{OK: true}
		return nil
	}
	if h == 0 {
		h = hostHash(a.Host)
	}
	if a.Pace.Unlimited() {
		if !l.mayHold(h) {
			// A host without an entry is neither parked nor modelled,
			// whatever other hosts are: no lock.
			*res = Reservation{OK: true}
			return nil
		}
	} else {
		l.tickAt(a.Now, d.Nanoseconds())
	}
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := hint
	if st == nil || st.dropped {
		st = s.hosts[a.Host]
	}
	if st == nil {
		if a.Pace.Unlimited() {
			*res = Reservation{OK: true} // not parked: parking creates the entry
			return nil
		}
		// A configured pace is kept whatever the bound on entries.
		st = s.add(l, a.Host, h, a.Now, true)
	}
	now := atSince(a.Now, d) // the entry's and its model's: they count from the same epoch
	if st.until.After(now) {
		*res = Reservation{ParkedUntil: timeOf(l.epoch, st.until)}
		return nil
	}
	if a.CheckOnly {
		*res = Reservation{OK: true}
		return nil
	}
	m := l.modelAt(st, now)
	if m == nil {
		s.reserve(l, st, a, now, a.Pace, 0, res)
		return nil
	}
	return s.reserveModelled(l, st, m, a, now, res)
}

// ticketAfterWait gives an attempt that waited for a slot taken before its
// host had a record, and is let go at now, a ticket of the record the host
// has got meanwhile, if it has one and is not down: the record hears its
// answer (a success ends a run of failures). Without one, a configured
// pace's requests, their slots taken seconds ahead, were answered unheard
// by the record a failure made, and its run of failures, broken by their
// successes, went on: a round robin with one member of three answering 502
// was taken for down, and 30 workers behind WithPace had 150 of 200 pages
// handed back with ErrHostDown (TestConfiguredPaceBrokenReplicaNotDown).
func (l *localLimiter) ticketAfterWait(host string, h uint32, now time.Time) (uint64, bool, *hostState) {
	if l.learning.Load() == 0 || !l.mayHold(h) {
		return 0, false, nil
	}
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.hosts[host]
	if st == nil {
		return 0, false, nil
	}
	m := l.modelAt(st, l.at(now))
	if m == nil || m.state == HostDown {
		return 0, false, nil
	}
	return m.send(l.at(now)), true, st
}

// reserveModelled is reserve for a host with a model, at now. The caller
// holds the shard's lock.
func (s *shard) reserveModelled(l *localLimiter, st *hostState, m *hostModel, a *Attempt, now instant, res *Reservation) *hostState {
	m.seen = now
	if m.state == HostDown {
		*res = m.admitDown(a.Host, now)
		return nil
	}
	if l.logger == nil {
		m.adjust(nil, now) // nothing to log: no changes noted
	} else {
		var ev changes
		m.adjust(&ev, now)
		l.logChanges(a.Host, &ev)
	}
	m.wake(now) // a limit grown or gone: the waiters first
	if a.Waited != nil {
		if t := m.collect(a.Waited); t != 0 {
			// The slot kept for it; the configured pace still applies.
			s.reserve(l, st, a, now, a.Pace, 0, res)
			if !res.OK {
				m.release(t)
				m.wake(now)
				return nil
			}
			m.tookQuota()
			res.Report, res.Ticket = true, t
			return st
		}
	}
	if m.q.active() {
		if at, spent := m.quotaWait(now); spent {
			// The host's quota is spent: none remain until it says they
			// do again, or until its reset.
			*res = Reservation{AskAgain: m.time(at)}
			return nil
		}
	}
	m.letGo(now)
	if m.ctl.limit > 0 && (m.busy() >= m.ctl.limit || m.waiting()) {
		m.ctl.busyAt = now
		w := m.enqueue()
		*res = Reservation{Wait: w.ch, Cancel: func(t time.Time) {
			s.mu.Lock()
			defer s.mu.Unlock()
			m.cancelWait(w, m.at(t))
		}}
		if m.ctl.held {
			// A fresh record's hold for an answer is waited out until
			// the record is a hold old at most: the answer it waits for
			// may be another host's (untold counts what the whole
			// process had on its way).
			res.AskAgain = m.time(m.since.Add(holdTime))
		}
		return nil
	}
	pace := a.Pace.min(m.pace())
	if nb := m.ctl.notBefore; !nb.IsZero() && !pace.Unlimited() {
		// The first slot no earlier than notBefore: the bucket's
		// theoretical arrival time runs a burst's tolerance ahead of it.
		if floor := nb.Add(time.Duration(pace.Burst-1) * pace.interval()); st.tat.Before(floor) {
			st.tat = floor
		}
	}
	m.syncQuota(st, pace, a.Now)
	s.reserve(l, st, a, now, pace, horizonFor(pace, a.Pace), res)
	if res.Delay > 0 && pace != a.Pace {
		m.ctl.busyAt = now // a request waits for the learned pace: it binds
	}
	if !res.OK {
		return nil
	}
	m.tookQuota()
	res.Report, res.Ticket = true, m.send(now)
	return st
}

// horizonFor is how far ahead pace hands out slots: a learned pace no
// further than horizon, so that it can grow under those waiting.
func horizonFor(pace, configured Pace) time.Duration {
	if pace == configured {
		return 0
	}
	return horizon
}

// reserve takes the host's next slot at pace, as Reserve answers it, into
// res (written in place: a Reservation is a dozen words to copy). The
// caller holds the shard's lock; now is a.Now as an instant of the
// limiter's epoch, which the caller has made.
func (s *shard) reserve(l *localLimiter, st *hostState, a *Attempt, now instant, pace Pace, horizon time.Duration, res *Reservation) {
	if pace.Unlimited() {
		*res = Reservation{OK: true}
		return
	}
	var latest instant
	if !a.Latest.IsZero() {
		latest = max(l.at(a.Latest), 1) // a deadline before the epoch's ten years is still one
	}
	delay, ok := st.take(now, pace, latest, horizon)
	if !ok {
		if horizon > 0 && delay > horizon && (a.Latest.IsZero() || !a.Now.Add(delay).After(a.Latest)) {
			*res = Reservation{AskAgain: a.Now.Add(delay - horizon)}
			return
		}
		*res = Reservation{Delay: delay}
		return
	}
	*res = Reservation{OK: true, Delay: delay}
	if delay > 0 {
		interval, after := pace.interval(), st.tat
		res.Cancel = func(now time.Time) {
			s.mu.Lock()
			defer s.mu.Unlock()
			st.giveBack(l.at(now), interval, after)
		}
	}
}

// model returns the host's model, forgetting an expired one; nil when the
// host has none. The caller holds the shard's lock.
func (l *localLimiter) model(st *hostState, now time.Time) *hostModel {
	return l.modelAt(st, l.at(now))
}

// modelAt is model at an instant of the limiter's epoch.
func (l *localLimiter) modelAt(st *hostState, now instant) *hostModel {
	if st.model != nil && st.model.expiredAt(now) {
		st.model.releaseAll()
		st.model = nil
		l.learning.Add(-1)
	}
	return st.model
}

// take gives the next slot at pace p: the generic cell rate algorithm,
// which is a token bucket of p.Burst refilled at p.Limit, kept as one time.
// Nothing is taken either when horizon is set and the slot is further away.
// The slot comes no earlier than the end of the host's last parking, and
// with no burst right after it, so a reopened host is not stormed. ok is
// false, and nothing is taken, when the slot would come after latest.
func (st *hostState) take(now instant, p Pace, latest instant, horizon time.Duration) (time.Duration, bool) {
	interval := p.interval()
	tolerance := time.Duration(p.Burst-1) * interval
	tat := max(st.tat, now)
	if st.until != 0 {
		tat = max(tat, st.until.Add(tolerance))
	}
	slot := max(tat.Add(-tolerance), now)
	delay := slot.Sub(now)
	if (!latest.IsZero() && slot.After(latest)) || (horizon > 0 && delay > horizon) {
		return delay, false
	}
	st.tat = tat.Add(interval)
	return delay, true
}

// giveBack returns a slot taken and not used, when it can still serve:
// only while it is the last one handed out (tat is still after, what its
// take left). Once a later slot went, rewinding tat by an interval would
// hand the later one out again, and two attempts would share it; the slot
// is lost instead, a wait of one interval at most.
func (st *hostState) giveBack(now instant, interval time.Duration, after instant) {
	if !st.tat.Equal(after) {
		return
	}
	if back := st.tat.Add(-interval); !back.Before(now) {
		st.tat = back
	}
}

func (l *localLimiter) Learn(_ context.Context, host string, sig Signal) (HostStatus, error) {
	hs := HostStatus{Pace: Pace{Limit: rate.Inf}}
	l.learn(host, hostHash(host), nil, &sig, &hs)
	return hs, nil
}

// learn is Learn given the host's hash, and its entry when the attempt's
// reservation returned one (reserve): an entry not dropped since is the
// one the host's lookup would find. It returns the host's state, what a
// Transport reads of an answer's; hs, when set, gets the whole status,
// which costs as much again to make.
func (l *localLimiter) learn(host string, h uint32, st *hostState, sig *Signal, hs *HostStatus) HostState {
	d := sig.Now.Sub(l.epoch)
	l.tickAt(sig.Now, d.Nanoseconds())
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == nil || st.dropped {
		st = s.hosts[host]
	}
	now := atSince(sig.Now, d)
	var m *hostModel
	if st != nil {
		m = l.modelAt(st, now)
	}
	if m == nil {
		if !worthARecord(sig) {
			return HostHealthy
		}
		if st == nil {
			if st = s.add(l, host, h, sig.Now, false); st == nil {
				// The shard is full: the host stays unrecorded, healthy.
				return HostHealthy
			}
		}
		m = newModel(l.gens.Add(1), &l.epoch, sig.Now)
		// At most what the process has on its way to every host: what it
		// sent in the last second is mostly answered already, by other
		// hosts, in a busy process.
		m.ghosts = float32(sig.InFlight)
		if sig.Ticket == 0 && !sig.Canceled {
			m.ghosts++ // the answer told now is one of them, and answer takes it out
		}
		st.model = m
		l.learning.Add(1)
		for n := sig.Now.Add(holdTime).Sub(l.epoch).Nanoseconds(); ; {
			if cur := l.freshUntil.Load(); n <= cur || l.freshUntil.CompareAndSwap(cur, n) {
				break
			}
		}
	}
	if l.logger == nil {
		m.answer(sig, now, nil) // nothing to log: no changes noted
	} else {
		var ev changes
		m.answer(sig, now, &ev)
		l.logChanges(host, &ev)
	}
	if hs != nil {
		*hs = m.status()
	}
	return m.state
}

// stateOf is learn of a Signal that names its moment alone (a question,
// which says nothing of the host): what a Transport asks before a retry
// spends its budget. The model's answer to such a Signal wakes the waiters
// and changes nothing else, so the model is asked that, with no Signal
// made or read; the rest is learn's.
func (l *localLimiter) stateOf(host string, h uint32, st *hostState, now time.Time) HostState {
	d := now.Sub(l.epoch)
	l.tickAt(now, d.Nanoseconds())
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == nil || st.dropped {
		st = s.hosts[host]
	}
	if st == nil {
		return HostHealthy // a question makes no record
	}
	at := atSince(now, d)
	m := l.modelAt(st, at)
	if m == nil {
		return HostHealthy
	}
	m.wake(at)
	return m.state
}

// worthARecord reports whether an answer says enough of a healthy host to
// start its model: it failed, refused or announced a quota.
func worthARecord(sig *Signal) bool {
	switch sig.outcome() {
	case refused, failed, served:
		return true
	case accepted:
		return sig.Limit > 0
	}
	return false
}

func (l *localLimiter) Park(_ context.Context, host string, until time.Time) error {
	now := l.clock.Now()
	l.tick(now)
	h := hostHash(host)
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	st := s.hosts[host]
	if st == nil {
		if st = s.add(l, host, h, now, false); st == nil {
			// The shard is full: the request told to wait waits, and
			// the host's others are told again.
			s.mu.Unlock()
			return nil
		}
	}
	if at := l.at(until); at.After(st.until) {
		st.until = at
	}
	s.mu.Unlock()
	for n := until.Sub(l.epoch).Nanoseconds(); ; {
		cur := l.parkedUntil.Load()
		if n <= cur || l.parkedUntil.CompareAndSwap(cur, n) {
			return nil
		}
	}
}

// probeBy brings a down host's next probe forward to at, when it is
// later: another process had the probe this one was given.
func (l *localLimiter) probeBy(host string, at time.Time) {
	s := &l.shards[shardOf(hostHash(host))]
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.hosts[host]; st != nil && st.model != nil && st.model.state == HostDown && st.model.at(at).Before(st.model.down.next) {
		st.model.down.next = st.model.at(at)
	}
}
