package retryhttp

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
)

// The Transport's side of the limiter: how an attempt is admitted, waits
// for its slot or its host's parking, and how an answer is told.

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
	// hash is the host's, and entry the in-process limiter's entry for
	// it when the slot asks for a report: the answer is learned with
	// them (Transport.learn), with no second hash or lookup.
	hash  uint32
	entry *hostState
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
	return t.admitAfter(ctx, host, admission{}, now, false)
}

// admitAfter is admit for a request whose attempt before was admitted as
// prev (zero for a first try, but for the host's hash when the caller made
// one already): the limiter is given the hash, and the entry prev holds.
// unasked says the caller did not ask admitted first (the host held an
// entry when it last looked: the limiter's reserve reads whether all is
// quiet first, as admitted does, so it is asked at once, with one reading
// of the limiter instead of two); admitted's sweep is then run here for a
// host found without an entry, which reserve is not asked of.
func (t *Transport) admitAfter(ctx context.Context, host string, prev admission, now time.Time, unasked bool) (admission, error) {
	h := prev.hash
	if h == 0 {
		h = hostHash(host)
	}
	if t.free != nil && !t.free.mayHold(h) {
		// No pace configured, and the host has no entry: neither parked
		// nor modelled, whatever other hosts hold.
		if unasked {
			t.free.tick(now)
		}
		return admission{at: now, hash: h}, nil
	}
	deadline, _ := ctx.Deadline()
	a := Attempt{Host: host, Pace: t.paceFor(host), Latest: deadline}
	stuck := 0          // AskAgain answers that named no later moment
	var res Reservation // filled in whole by each ask
	for {
		a.Now = now
		entry, err := t.reserve(ctx, &a, h, prev.entry, &res)
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
			adm := admission{at: now, ticket: res.Ticket, report: res.Report, hash: h, entry: entry}
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
				if !adm.report && t.local != nil {
					// The slot was taken before the host had a record;
					// it may have one now, which must hear the answer.
					adm.ticket, adm.report, adm.entry = t.local.ticketAfterWait(host, h, at)
				}
				return adm, nil
			}
			t.giveBack(ctx, host, adm) // parked meanwhile: a fresh slot behind the parking
			now = t.clock.Now()
		case res.Wait != nil:
			got, err := t.waitInFlight(ctx, host, now, res.Wait, deadline, res.AskAgain)
			if err != nil || !got {
				if res.Cancel != nil {
					res.Cancel(t.clock.Now())
				}
				if err != nil {
					return admission{at: now}, err
				}
				// The wait's bound came first: asked again as a new
				// request, with nothing kept for it.
				now = t.clock.Now()
				continue
			}
			a.Waited = res.Wait
			now = t.clock.Now()
		case !res.AskAgain.IsZero():
			// A learned pace, or a spent quota, is waited out only as far
			// as a parking would be.
			if res.AskAgain.Sub(now) < askAgainMin {
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

// reserve asks the limiter for a's slot: the in-process one directly,
// with the host's hash h and the entry hint an earlier attempt was given
// (nil: none); it also returns the host's entry, for learn.
func (t *Transport) reserve(ctx context.Context, a *Attempt, h uint32, hint *hostState, res *Reservation) (*hostState, error) {
	if t.local != nil {
		return t.local.reserve(a, h, hint, res), nil
	}
	var err error
	*res, err = t.limiter.Reserve(ctx, *a)
	return nil, err
}

// learn tells the limiter what an answer of the attempt admitted as adm
// says of host, and returns the host's state: the in-process limiter is
// told directly, with the hash and entry adm holds, and makes no status.
func (t *Transport) learn(ctx context.Context, host string, adm *admission, sig *Signal) (HostState, error) {
	if t.local != nil {
		h := adm.hash
		if h == 0 {
			h = hostHash(host)
		}
		return t.local.learn(host, h, adm.entry, sig, nil), nil
	}
	st, err := t.limiter.Learn(ctx, host, *sig)
	return st.State, err
}

// stateOf asks the limiter for host's state at now, telling it nothing of
// the host: the in-process one directly, with the hash and entry adm holds.
func (t *Transport) stateOf(ctx context.Context, host string, adm *admission, now time.Time) (HostState, error) {
	if t.local != nil {
		h := adm.hash
		if h == 0 {
			h = hostHash(host)
		}
		return t.local.stateOf(host, h, adm.entry, now), nil
	}
	st, err := t.limiter.Learn(ctx, host, Signal{Now: now, Reset: -1, Remaining: -1})
	return st.State, err
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
// wait, and no learned wait is longer. A wait that comes with an AskAgain
// moment ends then at the latest, reporting got false: the caller asks
// again.
func (t *Transport) waitInFlight(ctx context.Context, host string, now time.Time, freed <-chan struct{}, deadline, askAgain time.Time) (got bool, err error) {
	d := t.raMax
	if !deadline.IsZero() {
		d = min(d, deadline.Sub(now))
	}
	bounded := !askAgain.IsZero() && askAgain.Sub(now) < d
	if bounded {
		d = max(askAgain.Sub(now), 0)
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
		return false, ctx.Err()
	}
	select {
	case <-freed:
		return true, nil
	default:
		if bounded {
			return false, nil
		}
		return false, &paceError{host: host, wait: d}
	}
}

// maxAskAgain bounds the AskAgain answers in a row that name no later
// moment, or one less than askAgainMin later: a Limiter that keeps asking
// to ask again at once is failing, and the request is not spun on it.
const maxAskAgain = 100

// askAgainMin is the least step an AskAgain answer must take the request
// forward not to count as asking again at once: a millisecond, a hundred
// times more than any spin of the admission loop costs.
const askAgainMin = time.Millisecond

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
	if len(t.hostPace) == 0 {
		return t.pace // no lookup: most Transports pace no host of their own
	}
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
