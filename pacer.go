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
	ns := now.Sub(l.epoch).Nanoseconds()
	if ns >= l.sweepDue.Load() {
		l.sweepSome(now, ns)
	}
	return l.learning.Load() == 0 && ns >= l.parkedUntil.Load()
}

func (l *localLimiter) Reserve(_ context.Context, a Attempt) (Reservation, error) {
	if a.Pace.Unlimited() && l.quiet(a.Now) {
		return Reservation{OK: true}, nil
	}
	h := hostHash(a.Host)
	if a.Pace.Unlimited() {
		if !l.mayHold(h) {
			// A host without an entry is neither parked nor modelled,
			// whatever other hosts are: no lock.
			return Reservation{OK: true}, nil
		}
	} else {
		l.tick(a.Now)
	}
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.hosts[a.Host]
	if st == nil {
		if a.Pace.Unlimited() {
			return Reservation{OK: true}, nil // not parked: parking creates the entry
		}
		// A configured pace is kept whatever the bound on entries.
		st = s.add(l, a.Host, h, a.Now, true)
	}
	if st.until.After(l.at(a.Now)) {
		return Reservation{ParkedUntil: timeOf(l.epoch, st.until)}, nil
	}
	if a.CheckOnly {
		return Reservation{OK: true}, nil
	}
	m := l.model(st, a.Now)
	if m == nil {
		return s.reserve(l, st, a, a.Pace, 0), nil
	}
	now := m.at(a.Now)
	m.seen = now
	if m.state == HostDown {
		return m.admitDown(a.Host, now), nil
	}
	var ev changes
	m.adjust(&ev, now)
	l.logChanges(a.Host, &ev)
	m.wake(now) // a limit grown or gone: the waiters first
	if a.Waited != nil {
		if t := m.collect(a.Waited); t != 0 {
			// The slot kept for it; the configured pace still applies.
			res := s.reserve(l, st, a, a.Pace, 0)
			if !res.OK {
				m.release(t)
				m.wake(now)
				return res, nil
			}
			m.tookQuota()
			res.Report, res.Ticket = true, t
			return res, nil
		}
	}
	if m.q.active() {
		if at, spent := m.quotaWait(now); spent {
			// The host's quota is spent: none remain until it says they
			// do again, or until its reset.
			return Reservation{AskAgain: m.time(at)}, nil
		}
	}
	if m.ctl.limit > 0 && (m.inflight >= m.ctl.limit || m.waiting()) {
		m.ctl.busyAt = now
		w := m.enqueue()
		return Reservation{Wait: w.ch, Cancel: func(t time.Time) {
			s.mu.Lock()
			defer s.mu.Unlock()
			m.cancelWait(w, m.at(t))
		}}, nil
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
	res := s.reserve(l, st, a, pace, horizonFor(pace, a.Pace))
	if res.Delay > 0 && pace != a.Pace {
		m.ctl.busyAt = now // a request waits for the learned pace: it binds
	}
	if !res.OK {
		return res, nil
	}
	m.tookQuota()
	res.Report, res.Ticket = true, m.send(now)
	return res, nil
}

// horizonFor is how far ahead pace hands out slots: a learned pace no
// further than horizon, so that it can grow under those waiting.
func horizonFor(pace, configured Pace) time.Duration {
	if pace == configured {
		return 0
	}
	return horizon
}

// reserve takes the host's next slot at pace, as Reserve answers it.
// The caller holds the shard's lock.
func (s *shard) reserve(l *localLimiter, st *hostState, a Attempt, pace Pace, horizon time.Duration) Reservation {
	if pace.Unlimited() {
		return Reservation{OK: true}
	}
	var latest instant
	if !a.Latest.IsZero() {
		latest = max(l.at(a.Latest), 1) // a deadline before the epoch's ten years is still one
	}
	delay, ok := st.take(l.at(a.Now), pace, latest, horizon)
	if !ok {
		if horizon > 0 && delay > horizon && (a.Latest.IsZero() || !a.Now.Add(delay).After(a.Latest)) {
			return Reservation{AskAgain: a.Now.Add(delay - horizon)}
		}
		return Reservation{Delay: delay}
	}
	res := Reservation{OK: true, Delay: delay}
	if delay > 0 {
		interval, after := pace.interval(), st.tat
		res.Cancel = func(now time.Time) {
			s.mu.Lock()
			defer s.mu.Unlock()
			st.giveBack(l.at(now), interval, after)
		}
	}
	return res
}

// model returns the host's model, forgetting an expired one; nil when the
// host has none. The caller holds the shard's lock.
func (l *localLimiter) model(st *hostState, now time.Time) *hostModel {
	if st.model != nil && st.model.expired(now) {
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
	l.tick(sig.Now)
	h := hostHash(host)
	s := &l.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.hosts[host]
	var m *hostModel
	if st != nil {
		m = l.model(st, sig.Now)
	}
	if m == nil {
		if !worthARecord(&sig) {
			return HostStatus{Pace: Pace{Limit: rate.Inf}}, nil
		}
		if st == nil {
			if st = s.add(l, host, h, sig.Now, false); st == nil {
				// The shard is full: the host stays unrecorded, healthy.
				return HostStatus{Pace: Pace{Limit: rate.Inf}}, nil
			}
		}
		m = newModel(l.gens.Add(1), &l.epoch, sig.Now)
		// At most what the process has on its way to every host: what it
		// sent in the last second is mostly answered already, by other
		// hosts, in a busy process.
		m.ghosts = float64(sig.InFlight)
		st.model = m
		l.learning.Add(1)
		for n := sig.Now.Add(holdTime).Sub(l.epoch).Nanoseconds(); ; {
			if cur := l.freshUntil.Load(); n <= cur || l.freshUntil.CompareAndSwap(cur, n) {
				break
			}
		}
	}
	var ev changes
	m.answer(&sig, &ev)
	l.logChanges(host, &ev)
	return m.status(), nil
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

// paceError is a Transport's pace declining an attempt: its slot to the
// host comes after the request's deadline. It matches
// context.DeadlineExceeded, and an outer Transport never retries it.
type paceError struct {
	host string
	wait time.Duration
}

func (e *paceError) Error() string {
	return fmt.Sprintf("retryhttp: pacing %s needs a wait of %v, past the request's deadline", e.host, e.wait)
}

func (e *paceError) Unwrap() error { return context.DeadlineExceeded }

// admission is an attempt let go: when, and the ticket the limiter wants
// back with its answer.
type admission struct {
	at     time.Time
	ticket uint64
	report bool
}

// admit waits until an attempt to host may start, and returns when it
// started: out the host's parking, if it fits the max wait and the
// deadline, then for the pace's slot, or for a slot in flight. A parking
// set while it waits for the slot is waited out too, and the slot taken
// afresh behind it: no round limit, since every parking it waits out was
// named by a server and fits the bounds, and the deadline ends the rest.
// It returns a *HostDownError at once for a host that is down, a
// *HostPausedError when a parking, or a learned wait, does not fit the max
// or the deadline, a *paceError when the slot would come after the
// deadline, and the context's error when it ends the wait.
//
// now is the caller's reading of the clock: the success path reads it once
// per request, which matters where reading it costs 100 ns.
func (t *Transport) admit(ctx context.Context, host string, now time.Time) (admission, error) {
	if t.free != nil && !t.free.mayHold(hostHash(host)) {
		// No pace configured, and the host has no entry: neither parked
		// nor modelled, whatever other hosts hold.
		return admission{at: now}, nil
	}
	deadline, _ := ctx.Deadline()
	a := Attempt{Host: host, Pace: t.paceFor(host), Latest: deadline}
	stuck := 0 // AskAgain answers that named no later moment
	for {
		a.Now = now
		res, err := t.limiter.Reserve(ctx, a)
		if res.ParkedUntil.IsZero() {
			// A slot in flight kept for this request is collected by
			// this ask, unless the host is parked: then by the ask after
			// the parking. (Forgetting it there left the slot kept for
			// nobody, and every request queued behind it waited until
			// the kept slot's record was forgotten: a minute.)
			a.Waited = nil
		}
		switch {
		case err != nil:
			return admission{at: now}, err
		case res.Down != nil:
			return admission{at: now}, res.Down
		case res.OK:
			adm := admission{at: now, ticket: res.Ticket, report: res.Report}
			if res.Delay <= 0 {
				return adm, nil
			}
			at, err := t.waitSlot(ctx, host, now, res, deadline)
			if err != nil {
				t.giveBack(ctx, host, adm)
				return admission{at: now}, err
			}
			if !at.IsZero() {
				adm.at = at
				return adm, nil
			}
			t.giveBack(ctx, host, adm) // parked meanwhile: a fresh slot behind the parking
			now = t.clock.Now()
		case res.Wait != nil:
			if err := t.waitInFlight(ctx, host, now, res.Wait, deadline); err != nil {
				if res.Cancel != nil {
					res.Cancel(t.clock.Now())
				}
				return admission{at: now}, err
			}
			a.Waited = res.Wait
			now = t.clock.Now()
		case !res.AskAgain.IsZero():
			// A learned pace, or a spent quota, is waited out only as far
			// as a parking would be.
			if !res.AskAgain.After(now) {
				if stuck++; stuck > maxAskAgain {
					return admission{at: now}, fmt.Errorf("retryhttp: the limiter asked %d times in a row to ask again at once for %s", stuck, host)
				}
			}
			if err := t.waitParking(ctx, host, now, res.AskAgain, deadline); err != nil {
				return admission{at: now}, err
			}
			now = t.clock.Now()
		case res.ParkedUntil.IsZero():
			return admission{at: now}, &paceError{host: host, wait: res.Delay}
		default:
			if err := t.waitParking(ctx, host, now, res.ParkedUntil, deadline); err != nil {
				return admission{at: now}, err
			}
			now = t.clock.Now()
		}
	}
}

// waitSlot sleeps until a slot taken ahead, then waits out a parking set
// meanwhile. It returns when the attempt may start, or the zero time when a
// parking came first (the slot is then of no use: the caller takes a new
// one behind the parking).
func (t *Transport) waitSlot(ctx context.Context, host string, now time.Time, res Reservation, deadline time.Time) (time.Time, error) {
	// Delay counts from now, and the limiter may have taken a while to
	// answer (a round trip to Redis): sleep until the slot, not for Delay
	// from here, or the attempt goes late and bunches with the next one.
	slot := now.Add(res.Delay)
	if err := t.clock.Sleep(ctx, slot.Sub(t.clock.Now())); err != nil {
		if res.Cancel != nil {
			res.Cancel(t.clock.Now())
		}
		return now, err
	}
	now = t.clock.Now()
	// Another request's answer may have parked the host while this one
	// waited: look again, taking no second slot.
	until, err := t.parkedUntil(ctx, host, now)
	if err != nil || until.IsZero() {
		return now, err
	}
	if err := t.waitParking(ctx, host, now, until, deadline); err != nil {
		return now, err
	}
	return time.Time{}, nil
}

// giveBack returns the ticket of an attempt that will not be sent.
func (t *Transport) giveBack(ctx context.Context, host string, adm admission) {
	if adm.report {
		t.limiter.Learn(ctx, host, Signal{Now: t.clock.Now(), Ticket: adm.ticket, Canceled: true})
	}
}

// waitInFlight waits for a slot in flight to free, at most until the
// deadline and for the Retry-After max: a limit in flight is a learned
// wait, and no learned wait is longer.
func (t *Transport) waitInFlight(ctx context.Context, host string, now time.Time, freed <-chan struct{}, deadline time.Time) error {
	d := t.raMax
	if !deadline.IsZero() {
		d = min(d, deadline.Sub(now))
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // ends with the wait, whichever way it ends
		select {
		case <-freed:
			cancel()
		case <-wctx.Done():
		}
	}()
	if err := t.clock.Sleep(wctx, d); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-freed:
		return nil
	default:
		return &paceError{host: host, wait: d}
	}
}

// maxAskAgain bounds the AskAgain answers in a row that name no later
// moment: a Limiter that keeps asking to ask again at once is failing, and
// the request is not spun on it.
const maxAskAgain = 100

// parkedUntil asks the limiter whether host is parked, taking no slot.
func (t *Transport) parkedUntil(ctx context.Context, host string, now time.Time) (time.Time, error) {
	res, err := t.limiter.Reserve(ctx, Attempt{Host: host, Pace: Pace{Limit: rate.Inf}, Now: now, CheckOnly: true})
	return res.ParkedUntil, err
}

// waitParking waits until a parking ends, if that fits the max wait and the
// deadline.
func (t *Transport) waitParking(ctx context.Context, host string, now, until, deadline time.Time) error {
	if until.Sub(now) > t.raMax || (!deadline.IsZero() && until.After(deadline)) {
		return &HostPausedError{Host: host, Until: until}
	}
	return t.clock.Sleep(ctx, until.Sub(now))
}

// admitted reports, without asking the limiter, that an attempt made at now
// may start at once: the in-process limiter paces no host and none is
// parked. It is the success path's admit, and needs no host name.
func (t *Transport) admitted(now time.Time) bool {
	return t.free != nil && t.free.quiet(now)
}

// paceFor returns the pace configured for host: its own, else the default.
func (t *Transport) paceFor(host string) Pace {
	if p, ok := t.hostPace[host]; ok {
		return p
	}
	return t.pace
}

// park tells the limiter that host asked for a wait of d from now, and
// returns when the parking ends. The parking is bounded by MaxParking
// whatever the server said.
func (t *Transport) park(ctx context.Context, host string, now time.Time, d time.Duration) time.Time {
	until := now.Add(min(d, MaxParking))
	if err := t.limiter.Park(ctx, host, until); err != nil && t.logger != nil {
		t.logger.LogAttrs(ctx, slog.LevelWarn, "retryhttp: parking failed",
			slog.String("host", host), slog.String("error", err.Error()))
	}
	return until
}
