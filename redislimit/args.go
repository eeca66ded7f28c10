package redislimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
)

// The reserve script runs once per request, so its call is built without
// an allocation of its own: the command (EVALSHA, the script's hash, the
// count of keys, the keys, the arguments) lives in a block taken from a
// pool, its numbers in the block's own array and handed to go-redis as
// pointers (which it writes as the numbers they point to, where an int64
// put in an interface would be an allocation each), the host's key boxed
// once per host (memHost.key), and the answer read by an IntSliceCmd
// straight into its []int64 (Script.Run reads an []any of boxed numbers
// first, and copies it). What is left is go-redis's own (the command, the
// answer's slice, its connection check) and the call's context.

// reserveArgc is the reserve script's count of arguments (ARGV).
const reserveArgc = 14

// reserveCall is one reserve call's command, reused through reservePool.
// A call handed to a worker is the worker's until it has run it, though
// its caller gave up on it: the block goes back to the pool from whoever
// ran the call, after it ran.
type reserveCall struct {
	nums [reserveArgc]int64
	buf  [3 + 2 + reserveArgc]any
	args []any // buf, as long as this call's keys need
	base int   // where ARGV starts in args
}

var reservePool = sync.Pool{New: func() any { return new(reserveCall) }}

// Arguments of the command boxed once. The count of keys is an int, as
// go-redis's own EvalSha gives it (hooks may read it so); a small int is
// boxed without an allocation.
var (
	argEvalSha  any = "evalsha"
	argEval     any = "eval"
	reserveSHA  any = reserveScript.Hash()
	reserveBody any = reserveLua
)

// newReserveCall returns a block for a call naming key, and the server's
// epoch marker when it has one; the caller fills the arguments with num
// and str, and runs it with Limiter.runReserve.
func newReserveCall(srv *server, key any) *reserveCall {
	rc := reservePool.Get().(*reserveCall)
	rc.buf[0], rc.buf[1], rc.buf[3] = argEvalSha, reserveSHA, key
	if srv.markerArg == nil {
		rc.buf[2], rc.base = 1, 4
	} else {
		rc.buf[2], rc.buf[4], rc.base = 2, srv.markerArg, 5
	}
	rc.args = rc.buf[:rc.base+reserveArgc]
	return rc
}

// num sets ARGV[i+1] to the number n.
func (rc *reserveCall) num(i int, n int64) {
	rc.nums[i] = n
	rc.args[rc.base+i] = &rc.nums[i]
}

// str sets ARGV[i+1] to v, a string boxed once (see argEmpty).
func (rc *reserveCall) str(i int, v any) { rc.args[rc.base+i] = v }

// release puts rc back in the pool, holding nothing of the call.
func (rc *reserveCall) release() {
	clear(rc.buf[:])
	rc.args = nil
	reservePool.Put(rc)
}

// processor is what every client of go-redis is: a *redis.Client, a
// *redis.ClusterClient (which routes EVALSHA by its first key, as it
// does for Script.Run) and a *redis.Ring.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// exec runs rc on c, then releases it. A script the server does not know
// yet (a first call, a restart, SCRIPT FLUSH) is sent whole, as
// Script.Run does. A client that is not one of go-redis's gets the
// script through Script.Run.
func (rc *reserveCall) exec(ctx context.Context, c redis.Scripter) ([]int64, error) {
	defer rc.release()
	p, ok := c.(processor)
	if !ok {
		keys := []string{rc.args[3].(string)}
		if rc.base == 5 {
			keys = append(keys, rc.args[4].(string))
		}
		return reserveScript.Run(ctx, c, keys, rc.args[rc.base:]...).Int64Slice()
	}
	cmd := redis.NewIntSliceCmd(ctx, rc.args...)
	err := p.Process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		rc.args[0], rc.args[1] = argEval, reserveBody
		cmd = redis.NewIntSliceCmd(ctx, rc.args...)
		err = p.Process(ctx, cmd)
	}
	return cmd.Val(), err
}

// errAnswer is an answer of the reserve script too short to read.
func errAnswer(res []int64) error {
	return fmt.Errorf("redislimit: unexpected answer from the reserve script: %v", res)
}

// keys are the keys of the reserve script for host on srv: the host's,
// and the server's epoch marker when it has one.
func (l *Limiter) keys(srv *server, host string) []string {
	if srv.marker == "" {
		return []string{l.prefix + host}
	}
	return []string{l.prefix + host, srv.marker}
}

// reserveArgs sets rc's arguments for a, sent at sent (µs since the
// Limiter's start), a probe or not, and returns how long after sending this call could
// still renew the process's claim, should it fail here and run later.
func (l *Limiter) reserveArgs(rc *reserveCall, srv *server, a retryhttp.Attempt, p prep, sent int64, probe bool) time.Duration {
	var (
		interval time.Duration
		burst    int
	)
	if !a.Pace.Unlimited() {
		interval, burst = gcra(a.Pace)
	}
	rc.num(0, us(interval))
	rc.num(1, int64(burst))
	// Numbers go as numbers: go-redis writes them in decimal, as the
	// scripts read them, without a string made for each. The arguments
	// that are one of a few strings are boxed once (see argEmpty).
	rc.str(2, argEmpty) // no bound
	if !a.Latest.IsZero() {
		if d := a.Latest.Sub(a.Now); d >= 0 {
			rc.num(2, us(d))
		} else {
			rc.str(2, argMinusOne) // no slot is early enough, not even one now
		}
	}
	rc.str(3, argEmpty)
	mode, id, beat, flag := argEmpty, argEmpty, argEmpty, argEmpty
	timeout := l.timeout
	if a.CheckOnly {
		mode, timeout = argCheck, min(l.timeout, checkTimeout)
	} else {
		if p.ahead > 0 {
			rc.num(3, us(min(p.ahead, aheadFloor)))
		}
		if probe {
			mode = argProbe
		}
		id = l.idArg
		if p.beat {
			beat = argOne
		}
		switch {
		case p.had:
			flag = argHad
		case p.knew:
			flag = argKnew
		case p.waited:
			flag = argWaited
		}
	}
	rc.str(4, mode)
	rc.str(5, id)
	rc.str(6, l.win)
	rc.str(7, beat)
	rc.num(8, us(p.dl))
	by, pby, ok, late := l.bounds(srv, sent, timeout, p.dl)
	if ok {
		rc.num(9, by)
		rc.num(10, pby)
	} else {
		rc.str(9, argEmpty)
		rc.str(10, argEmpty)
	}
	known := srv.known.Load() // a string, boxed when stored
	if known == nil {
		known = argEmpty
	}
	rc.str(11, known)
	rc.str(12, flag)
	rc.num(13, int64(p.share))
	return late
}

// Arguments of the reserve script boxed once.
var (
	argEmpty    any = ""
	argMinusOne any = "-1"
	argCheck    any = "c"
	argProbe    any = "p"
	argOne      any = "1"
	argHad      any = "h"
	argKnew     any = "k"
	argWaited   any = "w"
)

// bounds are a call's bounds on srv's clock, for a call sent at sent (µs
// since the Limiter's start) and given timeout: after by it is stale and
// refused, after pby it renews no claim; and how long after sending it
// could still renew the claim for dl, should it fail here and run later.
// Without an estimate of the server's clock (no answer yet, or a Cluster)
// there are no bounds (ok false), and a failed call is taken to run
// within the timeout.
func (l *Limiter) bounds(srv *server, sent int64, timeout, dl time.Duration) (by, pby int64, ok bool, late time.Duration) {
	if !l.stale {
		return 0, 0, false, timeout + dl
	}
	off, rtt, ok := srv.clock.offset()
	if !ok {
		return 0, 0, false, timeout + dl
	}
	lag := min(presenceLate, timeout)
	by = sent + off + us(timeout) + 1000
	pby = sent + off + us(lag)
	return by, pby, true, lag + time.Duration(rtt)*time.Microsecond + dl
}
