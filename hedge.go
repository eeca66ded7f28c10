package retryhttp

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// Hedging (WithHedging): when the first attempt of a request that is safe
// to repeat has not answered after a delay, one more is sent beside it, and
// the first answer that needs no retry wins; the other attempt is cancelled
// and its body closed. A hedge is an attempt only once it is sent (R19):
// until then it holds no budget, no event, no body and no pace slot that
// another request could need, and a first answer that comes meanwhile
// abandons it. Once sent it is an attempt like any: it went through the
// host's pace and parking, spent the retry budget (refunded when it wins),
// carries its resend count, and was reported to the hooks
// (RetryEvent.Hedge) and the log just before it went. The delay is fixed,
// or learned from the host's recent answers (The Tail at Scale, Dean and
// Barroso 2013: a hedge after the 95th percentile cuts the tail for a few
// percent more requests).
//
// The first attempt runs on the caller's goroutine, and the hedge on the
// timer's (time.AfterFunc): a call answered before its delay pays for a
// timer and a context, no goroutine and no channel.

// hedgeFloor is the shortest learned hedge delay. Below it a hedge fires
// on the client's own scheduling delay rather than on the host's: with
// hundreds of goroutines on two cores, a goroutine waits for a core
// several of the runtime's 10 ms preemption slices, a GC pause adds to
// it, and a 10 ms floor hedged calls the host had answered in time. A
// hedge sooner than this also saves less than it costs (a request, maybe
// a connection).
const hedgeFloor = 50 * time.Millisecond

// hedgeStart is the learned delay while the host's latencies are not known
// yet (its first answers, or a host forgotten): the first wave of calls is
// hedged too, after a delay longer than most APIs' 95th percentile, so
// that a hung first call costs a quarter second, not its whole wait. The
// budget bounds how many such hedges go when a host is slower than that
// throughout.
const hedgeStart = 250 * time.Millisecond

// learnedHedge is the delay a host's latencies call for: their 95th
// percentile and an eighth, so that a host whose answers all take the same
// time is not hedged for the jitter of its clock; hedgeStart when none are
// known.
func learnedHedge(p95 time.Duration) time.Duration {
	if p95 <= 0 {
		return hedgeStart
	}
	return max(hedgeFloor, p95+p95/8)
}

// hedgeAfter returns when to hedge the call's first attempt; 0 for never.
// A request that is safe to repeat only by WithSafeToRepeat's word has its
// predicate asked here, before the first attempt, since a hedge repeats a
// request that has not failed.
func (c *call) hedgeAfter() time.Duration {
	t := c.t
	if !t.hedging || c.maxAttempts < 2 || !rewindable(c.req) ||
		!(c.key != "" || replayable(c.req) || c.safeToRepeat()) {
		return 0
	}
	if t.hedgeDelay > 0 {
		return t.hedgeDelay
	}
	return learnedHedge(c.adm.latency)
}

// hedgeState is where a hedge is: waiting for its delay, getting ready
// (admission, budget, body), sent, over (answered, or given up unsent), or
// lost (the call has its answer: the hedge cleans up after itself).
type hedgeState uint8

const (
	hedgeIdle hedgeState = iota
	hedgeReady
	hedgeSent
	hedgeOver
	hedgeLost
)

// hedger is a hedged call's hedge. It holds copies of what the hedge needs
// of the call, which stays on the caller's goroutine's stack.
type hedger struct {
	t           *Transport
	host        string
	base        *http.Request // what every attempt shares
	callerCtx   context.Context
	req         *http.Request // the caller's, for the reports
	key         string
	retryIf     func(*http.Response, error) bool
	delay       time.Duration
	timeout     time.Duration
	cancelFirst context.CancelFunc
	body        cancelReader // the first attempt's body, when it wins: no allocation of its own

	mu      sync.Mutex
	state   hedgeState
	cancel  context.CancelFunc // the hedge's context, made when it fires
	done    chan struct{}      // closed when the hedge is over, made when it fires
	adm     admission
	resp    *http.Response
	err     error
	sent    bool
	charged bool // the hedge spent the budget, at spentAt
	spentAt time.Time
	won     bool // its answer needs no retry: the first was cancelled for it, unless in
	firstIn bool // the first attempt answered: it is not cancelled for the hedge
}

// hedged makes the first attempt on the caller's goroutine, and a hedge
// after delay if the first has not answered by then. It returns the
// winning answer, observed, its n the attempts made (2 when the hedge
// went), and whether it was a plain success.
func (c *call) hedged(req *http.Request, delay time.Duration) (answer, bool) {
	t := c.t
	ctx, cancel := context.WithCancel(req.Context())
	h := &hedger{t: t, host: c.hostName(), base: req, callerCtx: c.ctx, req: c.req, key: c.key,
		retryIf: c.retryIf, delay: delay, timeout: c.attemptTimeout, cancelFirst: cancel}
	timer := time.AfterFunc(delay, h.fire)
	resp, err := t.attempt(req.WithContext(ctx), 1, c.attemptTimeout)
	first := answer{n: 1, resp: resp, err: err, adm: c.adm}

	h.mu.Lock()
	h.firstIn = true
	state := h.state
	if state == hedgeIdle || state == hedgeReady {
		// Unsent: abandoned. It may be waiting for its pace slot, which
		// its cancel gives back.
		h.state = hedgeLost
	}
	hcancel := h.cancel
	h.mu.Unlock()
	switch state {
	case hedgeIdle:
		timer.Stop()
		return h.keepFirst(c, &first)
	case hedgeReady:
		// Its cancel ends its wait for admission; wait for it to let go
		// (its slot given back, its report made), so that nothing of it
		// outlives the call.
		hcancel()
		<-h.done
		return h.keepFirst(c, &first)
	case hedgeSent:
		first.n = 2
		plain := !c.observe(&first)
		if plain || !c.retryable(&first) || first.down || (first.named && first.wait > 0) {
			// An answer that ends the call, or parks the host, comes back
			// at once, its body unread.
			h.abandon()
			return h.kept(&first, plain)
		}
		// Failed while the hedge in flight may yet answer: wait for it
		// (the caller's context bounds it, as it bounds the attempt).
		drain(first.resp)
		cancel()
		<-h.done
		return h.answer(c)
	}
	// Over: answered, or given up unsent, before the first answered.
	if !h.sent {
		return h.keepFirst(c, &first)
	}
	first.n = 2
	if h.won {
		// The first was cancelled for the hedge's answer.
		t.cleanUp(c.ctx, h.host, c.adm, first.resp)
		cancel()
		return h.answer(c)
	}
	if plain := !c.observe(&first); plain || !c.retryable(&first) {
		t.cleanUp(c.ctx, h.host, h.adm, h.resp) // failed, and lost: its charge stays spent
		h.cancel()
		return h.kept(&first, plain)
	}
	drain(first.resp)
	cancel()
	return h.answer(c)
}

// keepFirst hands back the first attempt's answer, the hedge unsent.
func (h *hedger) keepFirst(c *call, first *answer) (answer, bool) {
	return h.kept(first, !c.observe(first))
}

// kept hands back the first attempt's answer, observed: its context lives
// until its body is closed.
func (h *hedger) kept(first *answer, plain bool) (answer, bool) {
	switch resp := first.resp; {
	case resp == nil:
		h.cancelFirst()
	case isReadWriter(resp.Body):
		resp.Body = bodyWithCancel(resp.Body, h.cancelFirst)
	default:
		h.body = cancelReader{ReadCloser: resp.Body, cancel: h.cancelFirst}
		resp.Body = &h.body
	}
	return *first, plain
}

// answer hands back the hedge's answer, observed, as the call's second
// attempt: a plain success paid for itself, any other answer's charge is
// the call's, as a retry's would be.
func (h *hedger) answer(c *call) (answer, bool) {
	a := answer{n: 2, resp: h.resp, err: h.err, adm: h.adm}
	plain := !c.observe(&a)
	if h.charged {
		if plain {
			c.t.budget.refund(h.spentAt)
		} else {
			c.charge(h.spentAt)
		}
	}
	if a.resp != nil {
		a.resp.Body = bodyWithCancel(a.resp.Body, h.cancel)
	} else {
		h.cancel()
	}
	return a, plain
}

// abandon gives up a hedge in flight for the first's answer: it cleans up
// after itself once its base lets go, or now, if it answered meanwhile.
func (h *hedger) abandon() {
	h.mu.Lock()
	state := h.state
	h.state = hedgeLost
	h.mu.Unlock()
	h.cancel()
	if state == hedgeOver && h.sent {
		h.t.cleanUp(h.callerCtx, h.host, h.adm, h.resp)
	}
}

// fire is the hedge, on the timer's goroutine: admitted through the host's
// pace and parking, then given its budget, its body and its report, and
// sent, unless the first answered meanwhile.
func (h *hedger) fire() {
	t := h.t
	h.mu.Lock()
	if h.state != hedgeIdle {
		h.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.WithValue(h.base.Context(), resendKey{}, 1))
	h.state, h.cancel, h.done = hedgeReady, cancel, make(chan struct{})
	h.mu.Unlock()

	adm, err := t.admit(ctx, h.host, t.clock.Now())
	if err != nil {
		h.unsent(refusalReason(err))
		return
	}
	now := t.clock.Now()
	charged := t.budget != nil
	if charged && !t.budget.tryRetry(now) {
		t.giveBack(h.callerCtx, h.host, adm)
		h.unsent(ReasonBudget)
		return
	}
	req := h.base.WithContext(ctx)
	if h.base.Body != nil && h.base.Body != http.NoBody {
		body, err := h.req.GetBody()
		if err != nil {
			if charged {
				t.budget.refund(now)
			}
			t.giveBack(h.callerCtx, h.host, adm)
			h.unsent(ReasonGetBody)
			return
		}
		req.Body = body
	}
	h.mu.Lock()
	if h.state == hedgeLost { // the first answered while it got ready
		h.mu.Unlock()
		closeBody(req)
		if charged {
			t.budget.refund(now)
		}
		t.giveBack(h.callerCtx, h.host, adm)
		cancel()
		close(h.done)
		return
	}
	h.state, h.sent, h.adm, h.charged, h.spentAt = hedgeSent, true, adm, charged, now
	// Reported under the lock: a first answer that comes meanwhile waits
	// for the hooks, which are done before the call returns.
	t.reportHedge(h.callerCtx, h.req, h.key, h.host, h.delay)
	h.mu.Unlock()

	if t.budget == nil && !t.noLearning {
		t.sent.add(adm.at)
	}
	resp, err := t.attempt(req, 2, h.timeout)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == hedgeLost {
		t.cleanUp(h.callerCtx, h.host, adm, resp)
		cancel()
		return
	}
	h.resp, h.err, h.state = resp, err, hedgeOver
	judge := call{t: t, ctx: h.callerCtx, req: h.req, retryIf: h.retryIf}
	if h.won = !judge.retryable(&answer{resp: resp, err: err, now: t.clock.Now()}); h.won && !h.firstIn {
		// The caller waits in the first attempt: end it. One that answered
		// already keeps its context, whose body the caller may get.
		h.cancelFirst()
	}
	close(h.done)
}

// unsent ends a hedge that was not sent, and reports why, unless the
// first answer came meanwhile or the caller gave up.
// The report is made before the hedge is over, so that it is done before
// the call returns.
func (h *hedger) unsent(reason Reason) {
	h.mu.Lock()
	lost := h.state == hedgeLost
	h.mu.Unlock()
	h.cancel()
	if !lost && h.callerCtx.Err() == nil {
		h.t.reportNoHedge(h.callerCtx, h.req, h.key, h.host, h.delay, reason)
	}
	h.mu.Lock()
	if h.state != hedgeLost {
		h.state = hedgeOver
	}
	h.mu.Unlock()
	close(h.done)
}

// isReadWriter reports a body that is also an io.Writer (101 Switching
// Protocols), which must stay one.
func isReadWriter(body io.ReadCloser) bool {
	_, ok := body.(io.ReadWriteCloser)
	return ok
}

// cleanUp closes a lost attempt's answer and gives its ticket back: it
// says nothing of the host, which was not let finish.
func (t *Transport) cleanUp(ctx context.Context, host string, adm admission, resp *http.Response) {
	if resp != nil {
		resp.Body.Close()
	}
	t.giveBack(context.WithoutCancel(ctx), host, adm)
}

// latencyOnly tells the limiter, under WithLearning(false), what a learned
// hedge delay needs and nothing more: an accepted answer's latency, and
// the ticket of any other answer given back as saying nothing, so that
// the host model keeps the latencies without learning a pace, a limit or a
// state from the answers.
func (c *call) latencyOnly(sig *Signal, o outcome, report bool) {
	t := c.t
	s := Signal{Now: sig.Now, Ticket: sig.Ticket, Reset: -1, Remaining: -1}
	switch {
	case t.hedgeLearns && o == accepted:
		s.Status, s.Latency, s.KeepLatency = sig.Status, sig.Latency, true
	case report:
		s.Canceled = true
	default:
		return
	}
	t.limiter.Learn(c.ctx, c.hostName(), s)
}
