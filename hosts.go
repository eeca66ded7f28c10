package retryhttp

import (
	"context"
	"iter"
	"time"

	"golang.org/x/time/rate"
)

// Hosts returns the hosts the Transport holds a record of, with what it
// knows of each: its state and since when, the pace and limit in flight it
// learned, its parking, and when it will be forgotten (HostStatus, Host
// and ParkedUntil and ForgetAt set). A host that never misbehaved has no
// record and is not listed; nor is one already forgotten. For an operator's
// view: a health page, metrics (retryotel's host gauges range over it).
//
// It reads the in-process limiter one shard at a time, under that shard's
// lock alone, and sweeps the shard of what time made idle while it holds
// it; the caller's loop runs with no lock held, so it may send requests
// through the Transport. The order is unspecified. Hosts met while it runs
// may or may not be listed. With WithLimiter, it lists what this process
// holds (its host model and parkings), not what the Limiter given keeps
// elsewhere (Redis); a Transport whose limiter is of neither kind (no
// Transport made by New) lists nothing. Nothing of it touches the success
// path.
func (t *Transport) Hosts() iter.Seq[HostStatus] {
	var l *localLimiter
	switch lim := t.limiter.(type) {
	case *localLimiter:
		l = lim
	case *sharedLimiter:
		l = lim.local
	}
	return func(yield func(HostStatus) bool) {
		if l == nil {
			return
		}
		var buf []HostStatus
		for i := range l.shards {
			// A reading per shard: the sweep forgets nothing that
			// another request, with a later reading, still holds.
			buf = l.shards[i].statuses(l, t.clock.Now(), buf[:0])
			for _, hs := range buf {
				if !yield(hs) {
					return
				}
			}
		}
	}
}

// statuses sweeps the shard, then appends the status of each host it
// holds to buf.
func (s *shard) statuses(l *localLimiter, now time.Time, buf []HostStatus) []HostStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(l, now, false)
	for host, st := range s.hosts {
		hs := HostStatus{Pace: Pace{Limit: rate.Inf}}
		if m := l.model(st, now); m != nil {
			hs = m.status()
		}
		hs.Host, hs.ForgetAt = host, st.forgetAt(l.epoch)
		if st.until.After(l.at(now)) {
			hs.ParkedUntil = timeOf(l.epoch, st.until)
		}
		buf = append(buf, hs)
	}
	return buf
}

// HostPace returns the pace in force for host (a host name, host:port or
// URL, as WithHostPace takes): the configured one, or slower when the
// Transport has learned the host takes less. An unlimited Pace means the
// host is not paced by a rate (it may be held to a limit in flight: see
// HostStatus). For logs and metrics.
func (t *Transport) HostPace(ctx context.Context, host string) (Pace, error) {
	host = normalizeHostOption(host)
	configured := t.paceFor(host)
	st, err := t.limiter.Learn(ctx, host, Signal{Now: t.clock.Now(), Reset: -1, Remaining: -1})
	if err != nil {
		return configured, err
	}
	return configured.min(st.Pace), nil
}

// HostStatus returns what the Transport knows of host (a host name,
// host:port or URL, as WithHostPace takes): healthy, failing, overloaded,
// down or recovering, since when, and the pace or limit in flight it
// learned. For logs, metrics and health checks.
func (t *Transport) HostStatus(ctx context.Context, host string) (HostStatus, error) {
	host = normalizeHostOption(host)
	st, err := t.limiter.Learn(ctx, host, Signal{Now: t.clock.Now(), Reset: -1, Remaining: -1})
	st.Host = host
	return st, err
}
