package redislimit

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/retryhttp/retryhttp"
)

// While a server does not answer, the Limiter paces its hosts in process,
// each process at its share of the pace, probes the server once per probe
// interval, and hands it the parkings it learned meanwhile when it is
// back.

// local takes a slot from the in-process pacer for an attempt whose call to
// srv took elapsed. The pacer counts from now, not from before the call:
// a slot counted from a.Now would be up to a timeout in the past, and its
// attempt would go out with the next one.
func (l *Limiter) local(srv *server, a retryhttp.Attempt, elapsed time.Duration) retryhttp.Reservation {
	b := a
	b.Now = a.Now.Add(elapsed)
	r := l.mem.reserve(b, a.Pace, l.shares(srv, b.Now))
	if r.Delay > 0 || r.OK {
		r.Delay += elapsed
	}
	return r
}

// shares is how the in-process pacer divides a pace of srv's just now
// (on the Transport's clock).
func (l *Limiter) shares(srv *server, now time.Time) share {
	sh := share{fixed: l.share, peers: int(l.peers.Load()), claimed: l.rdb != nil && l.share == 0}
	if srv.down.Load() {
		since := time.Since(l.start)
		sh.downAt = now.Add(time.Duration(srv.downAt.Load()) - since)
		sh.retry = now.Add(max(time.Duration(srv.probeAt.Load())-since, 0))
		sh.stall = sh.claimed
	} else {
		sh.retry = now.Add(l.probe)
	}
	return sh
}

// useRedis reports whether this call should go to srv: always while it
// answers, and once per probe interval while it does not.
func (l *Limiter) useRedis(srv *server) bool {
	if l.rdb == nil {
		return false
	}
	if !srv.down.Load() {
		return true
	}
	now := int64(time.Since(l.start))
	at := srv.probeAt.Load()
	return now >= at && srv.probeAt.CompareAndSwap(at, now+int64(l.probe))
}

// fail records a failed call to srv: pace its hosts in process, and warn
// unless a warning was given in the last minute.
func (l *Limiter) fail(srv *server, err error) {
	now := int64(time.Since(l.start))
	srv.probeAt.Store(now + int64(l.probe))
	if !srv.down.Load() && srv.down.CompareAndSwap(false, true) {
		srv.downAt.Store(now)
		// Judged once, at the fall: the round trips before it are those
		// of calls answered while the server was up. Not on a Cluster,
		// whose late calls are not refused (see bounds): its processes
		// come back as before.
		srv.slow.Store(l.stale && errors.Is(err, errTimeout) && time.Duration(srv.peakRTT.Load()) >= l.timeout/2)
	}
	srv.inTime.Store(0) // answered within half the timeout in a row, no more
	l.slotFailed(srv)
	if l.logger == nil {
		return
	}
	last := l.warnedAt.Load()
	if now-last < int64(warnInterval) || !l.warnedAt.CompareAndSwap(last, now) {
		return
	}
	l.unsaid.Store(true)
	attrs := []slog.Attr{slog.String("error", err.Error()), slog.Duration("probe_every", l.probe)}
	if srv.name != "" {
		attrs = append(attrs, slog.String("shard", srv.name))
	}
	l.logger.LogAttrs(context.Background(), slog.LevelWarn,
		"redislimit: Redis failed; pacing in process until it answers (hosts first met meanwhile wait for it)", attrs...)
}

// slowBack is how many probes in a row must be answered within half the
// timeout, after a fall on a link about as slow as the timeout, before the
// Limiter goes back to Redis, unless one is answered within a tenth of it.
const slowBack = 5

// slowBackNow reports whether the answer srv just gave, after a fall on a
// slow link, shows the link fast again. An answer within half the timeout
// is no such sign on its own: on a link of 10-60 ms for a 50 ms timeout,
// three answers in ten are, and one call in five is still late; nor is
// one in time (the earlier rule: five in time in a row came within five
// seconds on such a link one time in three, and it fell again within a
// second). So back on an answer within a tenth of the timeout, which such
// a link does not give, or on slowBack answers in a row within half of
// it (one chance in 400 on that link, and certain within slowBack probes
// on a link fast again). An answer past half the timeout starts the count
// again, as a call that failed does (see fail).
func (l *Limiter) slowBackNow(srv *server) bool {
	rtt := time.Duration(srv.lastRTT.Load())
	switch {
	case rtt < l.timeout/10:
		return true
	case rtt >= l.timeout/2:
		srv.inTime.Store(0)
		return false
	}
	return srv.inTime.Add(1) >= slowBack
}

// answered records a call that srv answered: back to Redis, if the
// Limiter was pacing its hosts in process.
func (l *Limiter) answered(srv *server) { l.answeredFor(srv, "") }

// answeredFor is answered for a call about host ("": none): a probe for
// a host that has no share to pace in process, and so waits for Redis,
// brings the Limiter back to Redis whatever the link (see slowBack).
func (l *Limiter) answeredFor(srv *server, host string) {
	if !l.started.Load() && l.started.CompareAndSwap(false, true) {
		if l.channel != "" {
			l.spawn(l.listen)
		}
		l.spawn(l.checkPolicy)
	}
	if !srv.down.Load() {
		return
	}
	if srv.slow.Load() && (host == "" || l.share > 0 || l.mem.hasShare(host, time.Now())) && !l.slowBackNow(srv) {
		// Fell for answering late after answering near the bound: a
		// link about as slow as the timeout, or one mostly in time with
		// a tail past it. Going back at an answer that came in time
		// would fall back at the next late call (on a link with one
		// call in five late, within a second at 20/s), and each fall
		// costs the process the slots it holds back until the others
		// stop counting it present, and can meet the others' slots
		// with its first in process; pacing its share in process costs
		// nothing. So back only on the evidence of a link that is fast
		// again (see slowBackNow). Not so for a host that waits for
		// Redis, holding no share: held, it would wait for ever. A
		// freeze or a stop of a server that answered fast is not held
		// so: its processes come back at once. (Nor is a link that
		// slowed at the fall, its first late call coming before any slow
		// answer: holding a process whose probe answered slowly after a
		// fall from a fast link held those of a freeze whose probe
		// straddled the wake, and TestFirstContactDuringOutage/frozen
		// saw 22-23 where it sees 21. Such a process comes back, and is
		// held at its next fall, its peak slow by then.)
		return
	}
	if !srv.down.CompareAndSwap(true, false) {
		return
	}
	l.slotAnswered(srv)
	if l.unsaid.Swap(false) && l.logger != nil {
		l.logger.LogAttrs(context.Background(), slog.LevelInfo,
			"redislimit: Redis answers again; pacing shared")
	}
	// A Redis that restarted may have come back with another policy.
	l.spawn(l.checkPolicy)
	l.putBack(srv)
}

// putBack hands srv, on a goroutine of its own, the parkings this process
// knows of for hosts on it: those set while it was away, or lost with its
// data, so that the other processes see them too.
func (l *Limiter) putBack(srv *server) {
	if l.mem.parkings(time.Now()) == nil || !srv.flushing.CompareAndSwap(false, true) {
		return
	}
	if !l.spawn(func() { l.flush(srv) }) {
		srv.flushing.Store(false)
	}
}

func (l *Limiter) flush(srv *server) {
	defer srv.flushing.Store(false)
	for host, until := range l.mem.parkings(time.Now()) {
		rest := time.Until(until)
		if rest <= 0 || l.serverFor(host) != srv {
			continue
		}
		if l.ctx.Err() != nil {
			return
		}
		if err := l.parkRedis(l.ctx, srv, host, rest); err != nil {
			if !permanent(err) && l.ctx.Err() == nil {
				l.fail(srv, err)
			}
			return
		}
	}
}

// seenEpoch records the epoch an answer from srv told. Another than the one
// known means that srv lost its data since (a restart, a flush, a shard
// back empty), with the parkings it held: whoever holds one puts it back,
// whether or not it noticed an outage.
func (l *Limiter) seenEpoch(srv *server, e int64) {
	if e == 0 {
		return
	}
	srv.epochAt.Store(int64(time.Since(l.start)))
	old := srv.epoch.Swap(e)
	if old == e {
		return
	}
	srv.known.Store(strconv.FormatInt(e, 10))
	if old != 0 {
		l.putBack(srv)
	}
}

// pending returns the end of the slots the in-process pacer handed out for
// host, when it lies after now, and records the demand: a request
// waiting for them wants the host, and its claim is not to be given back.
// Not in a lane: Redis hands out no slot there, and answers each call
// with one more in process at the share (codeLane), so a request that
// waited for the process's slots to pass would leave the share unused
// meanwhile, each process taking one bunch of slots at a time and losing
// a place in the round between bunches (TestBucketOutlivesData: 10-16/s
// after a restart, for the pace of 20).
func (m *memory) pending(host string, now time.Time) (time.Time, bool) {
	if now.UnixNano() >= m.ownMax.Load() {
		return time.Time{}, false
	}
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil && h.own.After(now) && !now.Before(h.laneTo) {
		h.demand = later(h.demand, now)
		return h.own, true
	}
	return time.Time{}, false
}

// unanswered records a call for host that failed, but may still reach
// Redis and renew this process's claim until the moment bound.
func (m *memory) unanswered(host string, bound time.Time) {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[host]; h != nil && bound.After(h.lease) {
		h.lease = bound
	}
}
