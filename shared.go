package retryhttp

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// sharedLimiter is the Limiter of a Transport given one with WithLimiter:
// the host model still runs in the process (a host's state, its learned
// pace or limit in flight, a down host handed back at once), and the
// Limiter given adds what processes share: the configured pace across
// them, the parkings, the pace it learns from the refusals the model
// takes for load, and a host the model found down. A request goes when
// both let it: the model first, since what it refuses (a down host, a
// full limit in flight) costs the shared Limiter nothing, then the shared
// Limiter, whose slot comes at the later of the two.
type sharedLimiter struct {
	local  *localLimiter
	shared Limiter

	mu   sync.Mutex
	down map[string]time.Time // hosts found or told down lately, and when: their next answer that gets through is told
}

// downMemory is how long a host found or told down has its answers that
// get through told to the shared Limiter, which clears the host: longer
// than the shared mark of a down host lasts without a failed probe.
const downMemory = 10 * time.Second

func (s *sharedLimiter) Reserve(ctx context.Context, a Attempt) (Reservation, error) {
	la := a
	la.Pace = Pace{Limit: rate.Inf} // the configured pace is the shared one's to keep
	r, err := s.local.Reserve(ctx, la)
	if err != nil || !r.OK {
		return r, err
	}
	sa := a
	sa.Waited = nil
	if a.CheckOnly {
		return s.shared.Reserve(ctx, sa)
	}
	sr, err := s.shared.Reserve(ctx, sa)
	if err != nil || !sr.OK {
		s.giveBack(ctx, a, r) // the model's slot goes unused
		if sr.Down != nil {
			s.remember(a.Host, a.Now)
			// Another process has the probe: this one asks again
			// soon, so that the answer which clears the host for all
			// brings it back here too, not a probe interval later.
			s.local.probeBy(a.Host, a.Now.Add(probeEvery/10))
		}
		return sr, err
	}
	r.Delay = max(r.Delay, sr.Delay)
	if !r.Report && s.wasDown(a.Host, a.Now) {
		r.Report = true // the answer that gets through clears the host for all
	}
	if lc, sc := r.Cancel, sr.Cancel; sc != nil {
		r.Cancel = func(now time.Time) {
			if lc != nil {
				lc(now)
			}
			sc(now)
		}
	}
	return r, nil
}

// giveBack returns the model's slot of an attempt the shared Limiter did
// not let go.
func (s *sharedLimiter) giveBack(ctx context.Context, a Attempt, r Reservation) {
	if r.Cancel != nil {
		r.Cancel(a.Now)
	}
	if r.Report {
		s.local.Learn(ctx, a.Host, Signal{Now: a.Now, Ticket: r.Ticket, Canceled: true})
	}
}

func (s *sharedLimiter) Park(ctx context.Context, host string, until time.Time) error {
	s.local.Park(ctx, host, until)
	return s.shared.Park(ctx, host, until)
}

// Learn tells the model what an answer said, and the shared Limiter what
// matters to every process: a refusal the model takes for load (one it
// does not is a failure, and cuts no shared pace), an announced quota, a
// host the model holds down, and the answer that gets through after it.
// The host's state is the model's, or overloaded when only the shared
// Limiter holds it to a pace; its pace is the slower of the two.
func (s *sharedLimiter) Learn(ctx context.Context, host string, sig Signal) (HostStatus, error) {
	st, _ := s.local.Learn(ctx, host, sig)
	fwd, ok := s.forward(host, sig, st)
	if !ok {
		return st, nil
	}
	ss, err := s.shared.Learn(ctx, host, fwd)
	if st.State == HostHealthy && ss.State != HostHealthy {
		st.State, st.Since = ss.State, ss.Since
	}
	st.Pace = st.Pace.min(ss.Pace)
	return st, err
}

// forward is what the shared Limiter is told of sig, and whether it is.
func (s *sharedLimiter) forward(host string, sig Signal, st HostStatus) (Signal, bool) {
	if sig.Canceled {
		return sig, false // a ticket given back: the model's alone
	}
	fwd := sig
	fwd.Ticket = 0
	fwd.Refused = sig.Refused && (st.State == HostOverloaded || st.State == HostRecovering)
	if st.State == HostDown || (sig.Failed && sig.Status == 0 && s.wasDown(host, sig.Now)) {
		// Down here, or a probe of a host told down failed: down for all.
		fwd.Down = &HostDownError{Host: host, Since: st.Since, Retry: st.Retry}
		s.remember(host, sig.Now)
		return fwd, true
	}
	question := sig.Status == 0 && !sig.Failed
	quota := sig.Limit > 0 || sig.Remaining >= 0 || sig.Reset >= 0
	if question || quota || fwd.Refused || sig.Wait > 0 {
		return fwd, true
	}
	if through(sig) && s.forget(host, sig.Now) {
		return fwd, true // the host answers again: cleared for every process
	}
	return sig, false
}

// through reports an answer that got through to the host's application.
func through(sig Signal) bool {
	return !sig.Failed && sig.Status > 0 && !noOrigin(sig.Status) && !sig.Refused
}

// remember notes a host found or told down at now.
func (s *sharedLimiter) remember(host string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down == nil {
		s.down = make(map[string]time.Time)
	}
	for h, at := range s.down { // few: only hosts down lately
		if now.Sub(at) >= downMemory {
			delete(s.down, h)
		}
	}
	s.down[host] = now
}

// forget reports whether host was found or told down lately, and forgets
// it.
func (s *sharedLimiter) forget(host string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.down[host]
	delete(s.down, host)
	return ok && now.Sub(at) < downMemory
}

// wasDown reports whether host was found or told down lately.
func (s *sharedLimiter) wasDown(host string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.down[host]
	return ok && now.Sub(at) < downMemory
}
