package retryhttp

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// observe reads what an answer says of its host, parks the host when it
// named a wait, tells the limiter what the answer says of the host, and
// fills in a for decide. It reports false for a plain success: nothing to
// observe and nothing to decide. For a host without a model that costs
// three header lookups: no clock reading, no parsing and no call to the
// limiter.
func (c *call) observe(a *answer) bool {
	t, resp := c.t, a.resp
	var (
		h     http.Header
		code  int
		quota bool
	)
	if resp != nil {
		h, code = resp.Header, resp.StatusCode
		// A host that announces a quota says what remains of it too: a
		// few map lookups (quotaHeaders) tell such an answer.
		quota = quotaHeaders(h)
	}
	plain := resp != nil && code < 400 && c.retryIf == nil && !t.statuses.has(code)
	tell := a.adm.report || quota
	if plain && !tell {
		if tell = c.sentBeforeRecord(a.adm.at); !tell {
			return false
		}
	}
	now, latency := t.answeredAt(a.adm.at)
	a.now = now
	if a.adm.at.IsZero() {
		// Sent while the Transport was calm, or its host unheld, undated
		// (calm.go): before every record there is now, as far as the
		// record of its host can tell. An unheld call's start is its
		// first answer: the entries were held long before it was sent.
		a.adm.at = t.calmSent(now)
		if c.start.IsZero() {
			c.start = a.adm.at
			if c.unheld {
				c.start = now
			}
		}
		latency = now.Sub(a.adm.at)
	}
	sig := Signal{Now: now, Ticket: a.adm.ticket, Latency: latency, Status: code, Reset: -1, Remaining: -1}
	if resp == nil {
		sig.Err, sig.Failed = a.err, true
		sig.Canceled = c.ctx.Err() != nil // the caller's doing, not the host's
		sig.Unreachable = dialFailed(a.err)
	} else {
		c.readWaits(a, h, quota, &sig)
	}
	a.refused = sig.Refused
	o := sig.outcome()
	if t.noLearning || (!tell && (o == accepted || o == saysNothing)) {
		if t.noLearning {
			c.latencyOnly(&sig, o, a.adm.report) // hedge.go: the learned hedge delay's latencies
		}
		return !plain
	}
	c.tellLimiter(a, &sig, o)
	return !plain
}

// tellLimiter gives the limiter the Signal of answer a, of outcome o, and
// fills in what its host's state says for decide.
func (c *call) tellLimiter(a *answer, sig *Signal, o outcome) {
	t := c.t
	sig.InFlight = int(t.inflight.Load())
	if t.readsSent(o) {
		sig.Sent = t.sentLastSecond(sig.Now)
	}
	if a.adm.hash == 0 {
		a.adm.hash = c.hash // an unheld call's, made already (calm.go)
	}
	st, err := t.learn(c.ctx, c.hostName(), &a.adm, sig)
	if err != nil && t.logger != nil {
		t.logger.LogAttrs(c.ctx, slog.LevelWarn, "retryhttp: learning failed",
			slog.String("host", c.hostName()), slog.String("error", err.Error()))
	}
	a.down = st == HostDown
	a.paced = sig.Refused && (st == HostOverloaded || st == HostRecovering)
}

// readsSent reports whether the limiter may read Signal.Sent of an answer
// of outcome o. The in-process model reads it of a refusal or a failure
// alone; of any other answer it is not worth its two counts (a fifth of
// what learning a success costs), unless making it would spread undated
// counts (settle), which the later counts depend on: then it is made, so
// that they are spread as they were.
func (t *Transport) readsSent(o outcome) bool {
	if t.local == nil || o == refused || o == failed {
		return true
	}
	return t.sent.pending.Load() != 0 || (t.budget != nil && t.budget.firsts.pending.Load() != 0)
}

// sentBeforeRecord reports, for an attempt that got no ticket, whether a
// host just got a record: its answer may be one of a burst that host is
// still answering, which the record wants to hear of (see held). One
// atomic load while no host has a record; while some have, a second, and
// no clock reading: the attempt was sent at sent, and one sent after the
// newest record's hold says nothing to it (one sent before, answered
// after, is told: more than asked, never less).
func (c *call) sentBeforeRecord(sent time.Time) bool {
	l := c.t.free
	if l == nil || l.learning.Load() == 0 {
		return false
	}
	if sent.IsZero() && c.unheld {
		// Sent while its host held no entry (calm.go): its answer has a
		// record to tell only if the host has got one since.
		return l.mayHold(c.hash)
	}
	if sent.IsZero() {
		// Sent while no host held an entry (calm.go): before every
		// record there is now.
		return true
	}
	return sent.Sub(l.epoch).Nanoseconds() < l.freshUntil.Load()
}

// readWaits reads the waits and the quota an answer names, parks the host
// when it named one, and fills in the Signal.
func (c *call) readWaits(a *answer, h http.Header, quota bool, sig *Signal) {
	t, resp, now := c.t, a.resp, a.now
	code := resp.StatusCode
	if !quota && code < 400 {
		// What the reading below makes of a success that announces no
		// quota, without its lookups: no wait, no refusal, no quota.
		a.wait, a.named = 0, false
		sig.Limit, sig.Window, sig.Reset, sig.Remaining = 0, 0, 0, 0
		return
	}
	var q announcement
	// A quota of some of the host's endpoints (GitHub's search, graphql,
	// ... beside core, under the same header names) says nothing of the
	// host: it paces nothing, and its spent quota holds only the request
	// that met it (which waits for the reset), not the host's others. A
	// Retry-After on a refusal is the host's word all the same.
	scoped := quota && scopedQuota(h)
	f := waitFamilies(h, code, quota)
	if quota && !t.noLearning && !scoped {
		q = announcedIn(h, f, now)
	}
	a.wait, a.named = serverWait(resp, f, now)
	park := a.named && a.wait > 0 && (code >= 400 || t.noLearning || q.limit == 0)
	if park && scoped {
		_, said := retryAfter(h, now)
		park = said && code >= 400
	}
	// A spent quota on a success is the model's to hold while it learns
	// (until the reset, or the next grant of a window that slides); a
	// refusal that names its moment parks the host.
	if park {
		until := t.park(c.ctx, c.hostName(), now, max(a.wait, t.raFloor))
		if len(t.onPark) > 0 {
			ev := ParkEvent{Request: c.req, Host: c.hostName(), Until: until, Status: code}
			for _, hook := range t.onPark {
				hook(ev)
			}
		}
	}
	limited := code == http.StatusTooManyRequests || (!scoped && quotaRefusal(resp, now)) // the host says it limits the rate
	// A 503 or 529 is a refusal too: bare (nginx's limit_req, a full
	// queue), or naming when to come back, which says the host limits
	// what it takes as a 429 does.
	busy := code == http.StatusServiceUnavailable || code == statusOverloaded
	sig.Refused = limited || busy
	if (limited || busy) && a.named {
		sig.Wait = max(a.wait, t.raFloor)
	}
	sig.Limit, sig.Window, sig.Reset, sig.Remaining = q.limit, q.window, q.reset, q.remaining
}

// dialFailed reports an attempt that never got a connection: a dial that
// failed, refused or unreachable.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// serverWait is the wait a response names: Retry-After on an error status,
// else the reset of a spent quota, in the families f of quota headers it
// may hold (waitFamilies).
func serverWait(resp *http.Response, f limitFamilies, now time.Time) (time.Duration, bool) {
	h := resp.Header
	if resp.StatusCode >= 400 {
		if w, ok := retryAfter(h, now); ok {
			return w, true
		}
	}
	return quotaResetIn(h, f, now)
}

// waitFamilies is the families of quota headers that serverWait and
// announced read of an answer of status code whose header h is, quota
// being quotaHeaders(h). A success without the remaining count of a quota
// of requests is read for none: it names no wait, as it names none to a
// host without a record (observe reads nothing of such an answer), and
// the pass over its names (limitFamiliesOf) is most of what a record's
// success would read.
func waitFamilies(h http.Header, code int, quota bool) limitFamilies {
	if !quota && code < 400 {
		return 0
	}
	return limitFamiliesOf(h)
}

// learnMaxWindow is the longest window an announced quota may have: a
// longer one is absurd, and ignored.
const learnMaxWindow = 24 * time.Hour
