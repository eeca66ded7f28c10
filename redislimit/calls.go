package redislimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A call to Redis must end by the Limiter's timeout. A client made with
// ContextTimeoutEnabled sees to that itself, and is called directly. Any
// other bounds a read by its own ReadTimeout (5 s by default, or never),
// whatever the context says: the call is made by a worker goroutine, and the
// Limiter stops waiting for it at the deadline, leaving the worker to finish
// it. Workers live on between calls, because a fresh goroutine per call
// costs more than the round trip itself (its stack grows anew through
// go-redis's call path each time); they are started when needed, at most
// maxWorkers of them, and leave after workerIdle without work or at Close.
const (
	maxWorkers = 64
	workerIdle = 10 * time.Second
)

// call is one script run handed to a worker.
type call struct {
	ctx  context.Context
	c    redis.Scripter
	s    *redis.Script
	keys []string
	args []any
	rc   *reserveCall // instead of s, keys and args: a reserve call
	done chan result  // buffered: a worker never waits on an abandoned call
}

// callPool holds calls for the workers, each with its channel.
var callPool = sync.Pool{New: func() any { return &call{done: make(chan result, 1)} }}

type result struct {
	vals []int64
	err  error
}

// errTimeout is returned when Redis has not answered within the timeout.
var errTimeout = errors.New("redislimit: no answer from Redis in time")

// run runs a script on keys of srv within the Limiter's timeout and
// returns its answer, an array of integers.
func (l *Limiter) run(ctx context.Context, srv *server, s *redis.Script, keys []string, args ...any) ([]int64, error) {
	return l.do(ctx, srv, &call{s: s, keys: keys, args: args})
}

// runReserve runs the reserve call rc on srv, as run does; rc is released
// once it has run, or at once if it cannot run.
func (l *Limiter) runReserve(ctx context.Context, srv *server, rc *reserveCall) ([]int64, error) {
	c := call{rc: rc}
	return l.do(ctx, srv, &c)
}

// do runs c on srv within the Limiter's timeout.
func (l *Limiter) do(ctx context.Context, srv *server, c *call) ([]int64, error) {
	rdb, err := l.client(srv)
	if err != nil {
		if c.rc != nil {
			c.rc.release()
		}
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	var r result
	if l.direct {
		r.vals, r.err = c.exec(ctx, rdb)
	} else {
		// Handed to a worker, the call is the worker's: a copy from
		// callPool, so that this one stays on the caller's stack. The
		// copy goes back to the pool once its answer was read (the
		// worker is done with it then); one given up on is left to the
		// worker, and to the collector.
		w := callPool.Get().(*call)
		w.ctx, w.c, w.s, w.keys, w.args, w.rc = ctx, rdb, c.s, c.keys, c.args, c.rc
		if l.hand(ctx, w) {
			select {
			case r = <-w.done:
				*w = call{done: w.done}
				callPool.Put(w)
			case <-ctx.Done():
				r.err = ctx.Err()
			}
		} else {
			*w = call{done: w.done}
			callPool.Put(w)
			if c.rc != nil {
				c.rc.release()
			}
			r.err = ctx.Err()
		}
	}
	if r.err == nil {
		srv.answeredIn(time.Since(start))
	}
	if r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Said once, whoever noticed the deadline first: the client or
		// the Limiter.
		r.err = fmt.Errorf("%w (%v)", errTimeout, l.timeout)
	}
	return r.vals, r.err
}

// exec runs c on rdb.
func (c *call) exec(ctx context.Context, rdb redis.Scripter) ([]int64, error) {
	if c.rc != nil {
		return c.rc.exec(ctx, rdb)
	}
	return c.s.Run(ctx, rdb, c.keys, c.args...).Int64Slice()
}

// hand gives c to an idle worker, or to a new one while there are fewer
// than maxWorkers, or else to the first worker free before ctx ends. It
// reports whether a worker took c; none does once the Limiter is closed.
func (l *Limiter) hand(ctx context.Context, c *call) bool {
	select {
	case l.calls <- c:
		return true
	default:
	}
	if l.workers.Add(1) <= maxWorkers {
		if l.spawn(func() { l.work(c) }) {
			return true
		}
		l.workers.Add(-1) // closed: the call gets no worker
		return false
	}
	l.workers.Add(-1)
	select {
	case l.calls <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

// work runs c, then the calls handed to it, until it has been idle for
// workerIdle or the Limiter is closed.
func (l *Limiter) work(c *call) {
	defer l.workers.Add(-1)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		vals, err := c.exec(c.ctx, c.c)
		c.done <- result{vals, err}
		idle.Reset(workerIdle)
		select {
		case c = <-l.calls:
		case <-idle.C:
			return
		case <-l.ctx.Done():
			return
		}
	}
}
