package redislimit

import (
	"context"
	"log/slog"
	"time"

	"github.com/retryhttp/retryhttp"
)

// While Redis does not answer, the Limiter paces in process, each process
// at its share of the pace, probes Redis once per probe interval, and hands
// Redis the parkings it learned meanwhile when Redis is back.

// local takes a slot from the in-process pacer for an attempt whose call to
// Redis took elapsed. The pacer counts from now, not from before the call:
// a slot counted from a.Now would be up to a timeout in the past, and its
// attempt would go out with the next one.
func (l *Limiter) local(a retryhttp.Attempt, elapsed time.Duration) retryhttp.Reservation {
	b := a
	b.Now = a.Now.Add(elapsed)
	r := l.mem.reserve(b, a.Pace, l.shares())
	if r.Delay > 0 || r.OK {
		r.Delay += elapsed
	}
	return r
}

// shares is how the in-process pacer divides a pace just now.
func (l *Limiter) shares() share {
	sh := share{fixed: l.share, peers: int(l.peers.Load())}
	if l.down.Load() {
		sh.downAt = l.start.Add(time.Duration(l.downAt.Load()))
	}
	return sh
}

// useRedis reports whether this call should go to Redis: always while
// Redis answers, and once per probe interval while it does not.
func (l *Limiter) useRedis() bool {
	if l.rdb == nil {
		return false
	}
	if !l.down.Load() {
		return true
	}
	now := int64(time.Since(l.start))
	at := l.probeAt.Load()
	return now >= at && l.probeAt.CompareAndSwap(at, now+int64(l.probe))
}

// returning reports whether Redis came back from an outage lately: within a
// probe interval, every process that paced in process has tried it again.
func (l *Limiter) returning() bool {
	back := l.backAt.Load()
	return back != 0 && int64(time.Since(l.start))-back < int64(l.probe)
}

// fail records a failed call: pace in process, and warn unless a warning
// was given in the last minute.
func (l *Limiter) fail(err error) {
	now := int64(time.Since(l.start))
	l.probeAt.Store(now + int64(l.probe))
	if !l.down.Load() && l.down.CompareAndSwap(false, true) {
		l.downAt.Store(now)
	}
	if l.logger == nil {
		return
	}
	last := l.warnedAt.Load()
	if now-last < int64(warnInterval) || !l.warnedAt.CompareAndSwap(last, now) {
		return
	}
	l.unsaid.Store(true)
	l.logger.LogAttrs(context.Background(), slog.LevelWarn,
		"redislimit: Redis failed; pacing in process until it answers",
		slog.String("error", err.Error()),
		slog.Duration("probe_every", l.probe))
}

// answered records a call that Redis answered: back to Redis, if the
// Limiter was pacing in process.
func (l *Limiter) answered() {
	if !l.started.Load() && l.started.CompareAndSwap(false, true) {
		if l.channel != "" {
			l.spawn(l.listen)
		}
		l.spawn(l.checkPolicy)
	}
	if !l.down.Load() || !l.down.CompareAndSwap(true, false) {
		return
	}
	l.backAt.Store(max(int64(time.Since(l.start)), 1))
	if l.unsaid.Swap(false) && l.logger != nil {
		l.logger.LogAttrs(context.Background(), slog.LevelInfo,
			"redislimit: Redis answers again; pacing shared")
	}
	// A Redis that restarted may have come back with another policy.
	l.spawn(l.checkPolicy)
	if l.mem.parkings(time.Now()) != nil && l.flushing.CompareAndSwap(false, true) {
		if !l.spawn(l.flush) {
			l.flushing.Store(false)
		}
	}
}

// flush hands Redis the parkings this process knows of, those set while
// Redis was down among them, so that other processes see them too.
func (l *Limiter) flush() {
	defer l.flushing.Store(false)
	for host, until := range l.mem.parkings(time.Now()) {
		rest := time.Until(until)
		if rest <= 0 {
			continue
		}
		if l.ctx.Err() != nil {
			return
		}
		if err := l.parkRedis(l.ctx, host, rest); err != nil {
			if !permanent(err) && l.ctx.Err() == nil {
				l.fail(err)
			}
			return
		}
	}
}
