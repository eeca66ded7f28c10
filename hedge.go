package retryhttp

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Hedging (WithHedging): when the first attempt of a request that is safe
// to repeat has not answered after a delay, one more is sent beside it;
// when that one too is unanswered another delay later (it may have met a
// hung request, as the first did), one more again, up to hedgeInFlight
// attempts in all (and WithMaxAttempts). The first answer that needs no
// retry wins; the others are cancelled and their bodies closed. A hedge is
// an attempt only once it is sent (R19): until then it holds no budget, no
// event, no body and no pace slot that another request could need, and a
// first answer that comes meanwhile abandons it. Once sent it is an
// attempt like any: it went through the host's pace and parking, spent the
// retry budget (refunded when it wins), carries its resend count, and was
// reported to the hooks (RetryEvent.Hedge) and the log just before it
// went. The delay is fixed, or learned from the host's recent answers (The
// Tail at Scale, Dean and Barroso 2013: a hedge after the 95th percentile
// cuts the tail for a few percent more requests).
//
// The first attempt runs on the caller's goroutine, and each hedge on the
// timer's (time.AfterFunc): a call answered before its delay pays for its
// hedgeFirst (the first attempt's request and context) alone, no
// goroutine, no channel and no context of its own; its hedger and timer,
// still set, are handed on to the next call (hedgetimer.go).

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

// hedgeInFlight is how many attempts a hedged call has at most, the first
// included: the first and two hedges, all of them in flight at once at
// worst. A hedge still unanswered after another delay may have met a hung
// request too, as the first did, and is hedged in turn (WithMaxAttempts
// bounds it as well): one hung request in five leaves a call hung only
// when three of its attempts in a row are, not two.
const hedgeInFlight = 3

// mayHedge reports whether the call's first attempt is hedged, needKey
// saying it gets WithAutoIdempotencyKey's key; prepare asks it, before
// the first attempt's request is made. A request that is safe to repeat
// only by WithSafeToRepeat's word has its predicate asked here, since a
// hedge repeats a request that has not failed.
func (c *call) mayHedge(needKey bool) bool {
	return c.t.hedging && c.maxAttempts >= 2 && rewindable(c.req) &&
		(needKey || replayable(c.req) || c.safeToRepeat())
}

// hedgeAfter returns when to hedge the call's first attempt; 0 for never.
func (c *call) hedgeAfter() time.Duration {
	t := c.t
	if !c.hedge {
		return 0
	}
	if t.hedgeDelay > 0 {
		return t.hedgeDelay
	}
	at := c.start
	if at.IsZero() {
		// Calm or unheld, on the real clock (calm.go): the reading the
		// hedge's timer needs, made now, dates the attempt too.
		at = time.Now()
		c.hedgeAt = at
	}
	p95, lat := t.latencies.find(c.req.URL.Host, at)
	c.lat, c.timed = lat, lat.timed(p95)
	return learnedHedge(p95)
}

// hedgeState is where a hedge is: getting ready (admission, budget,
// body), sent, or over (answered, or given up unsent).
type hedgeState uint8

const (
	hedgeReady hedgeState = iota + 1
	hedgeSent
	hedgeOver
)

// hedgeAttempt is one hedge of a call.
type hedgeAttempt struct {
	n       int // its attempt: 2 for the first hedge
	state   hedgeState
	cancel  context.CancelFunc
	adm     admission
	resp    *http.Response
	err     error
	sent    bool
	charged bool // it spent the budget, at spentAt
	spentAt time.Time
	cleaned bool // its answer was closed, its ticket given back
}

// hedger is a hedged call's first attempt and its hedges. It holds copies
// of what the hedges need of the call, which stays on the caller's
// goroutine's stack, its timer, and the first attempt's request and
// context (in its hedgeFirst, which the caller may keep: the answer's
// Request and Body). A call answered before its delay hands its hedger
// and timer on to the next call (hedgetimer.go), and pays for its
// hedgeFirst alone, made with its marked request when it has one.
type hedger struct {
	*hedgeFirst
	timer   *time.Timer
	fireFn  func() // h.fire, made once with the hedger
	t       *Transport
	lat     *hostLatencies // the host's, as hedgeAfter found them: the first's answer goes there
	base    *http.Request  // what every attempt shares
	req     *http.Request  // the caller's, for the reports; its context is the call's
	key     string
	retryIf func(*http.Response, error) bool
	delay   time.Duration
	timeout time.Duration
	timed   bool // its attempts' latencies are learned (hostLatencies.timed)

	mu       sync.Mutex
	firstIn  bool // the first answered: no hedge's answer cancels it
	over     bool // the call is done with hedging: no more go, the others clean up after themselves
	limit    int8 // attempts at most, the first included (hedgeInFlight or fewer)
	keepable bool // made outside any synctest bubble: it may be handed on (hedgetimer.go)
	// due is when the first hedge of the call holding the hedger is due,
	// zero while none holds it; set is when the timer was set to fire for
	// it, zero once it fired (hedgetimer.go; a hedger a hedge went from is
	// never handed on, and its set no longer matters). Both are
	// readings of the clock the timer runs on.
	due, set  time.Time
	*hedgeSet // made when the first hedge is due
}

// hedgeFirst is a hedged call's first attempt: its request, on its own
// context, and its body when it is the answer. The caller may keep them
// (the answer's Request and Body): they are never handed on.
type hedgeFirst struct {
	first http.Request // the first attempt: the call's request, on ctx
	ctx   firstCtx
	body  firstBody // the first attempt's body, when it is the answer
}

// markedHedger is a hedged call's first attempt and the mark of its
// request for an unknown base, made in one allocation. The call's base
// request (c.base) is the first attempt's request itself, made on the
// first's context (newMarked), and what the hedges and retries make from
// it takes the context under that one (c.baseCtx, the first's parent), so
// that the call makes one copy of its request, not three, and the whole
// stays under 512 bytes, which the runtime allocates with no header.
type markedHedger struct {
	f    hedgeFirst
	mark passedDownCtx
}

// newMarked returns the mark of the call's request for an unknown base
// and where the marked request goes: for a call to be hedged, both in one
// allocation with its first attempt (c.spare), whose request it is.
func (c *call) newMarked() (*passedDownCtx, *http.Request) {
	if !c.hedge {
		m := new(markedRequest)
		return &m.ctx, &m.req
	}
	mh := new(markedHedger)
	c.spare = &mh.f
	return &mh.mark, &mh.f.first
}

// hedgeSet is a hedged call's hedges, once one is due: a call answered
// before its delay makes none.
type hedgeSet struct {
	host     string
	fired    int // hedges due so far
	sent     int // hedges sent so far
	hedges   [hedgeInFlight - 1]hedgeAttempt
	winner   *hedgeAttempt // the first hedge whose answer needs no retry
	lastOver *hedgeAttempt // the last hedge that answered, failed
	wake     chan struct{} // poked at every hedge's change
}

// hedged makes the first attempt on the caller's goroutine, and hedges
// after each delay that passes with no answer, up to hedgeInFlight
// attempts. It returns the winning answer, observed, its n the attempts
// made, and whether it was a plain success.
func (c *call) hedged(req *http.Request, delay time.Duration) (answer, bool) {
	t := c.t
	f := c.spare
	if f == nil {
		f = new(hedgeFirst)
	}
	now := c.hedgeAt
	if now.IsZero() {
		now = c.timerNow()
	}
	h := c.t.takeHedger(noBubble(now))
	h.hedgeFirst = f
	h.t, h.lat, h.base, h.req, h.key, h.retryIf = t, c.lat, req, c.req, c.key, c.retryIf
	h.delay, h.timeout, h.limit, h.timed = delay, c.attemptTimeout, int8(min(c.maxAttempts, hedgeInFlight)), c.timed
	h.ctx.init(c.baseCtx)
	if req != &f.first {
		f.first = *req.WithContext(&h.ctx) // copied into the hedgeFirst: no request of its own
	}
	h.mu.Lock() // fire reads the timer, to set it again
	h.arm(now, delay)
	h.mu.Unlock()
	resp, err := t.attempt(&h.first, 1, c.attemptTimeout)
	first := answer{n: 1, resp: resp, err: err, adm: c.adm}
	sent := c.adm.at
	if sent.IsZero() {
		sent = now // calm or unheld, on the real clock: now was read for it
	}
	h.learn(h.lat, resp, sent)

	h.mu.Lock()
	h.firstIn = true
	if h.hedgeSet == nil {
		// No hedge went: the first's answer is the call's, or its retry's.
		h.over = true
		h.mu.Unlock()
		h.disarm() // h is handed on: not to be touched again
		return f.keep(&first, !c.observe(&first))
	}
	won := h.winner
	h.mu.Unlock()
	if won != nil {
		// The first was cancelled for a hedge's answer.
		h.end(won)
		t.cleanUp(c.ctx, c.hostName(), c.adm, first.resp)
		h.ctx.cancel()
		return h.answer(c, won)
	}
	plain := !c.observe(&first)
	if plain || !c.retryable(&first) || first.down || (first.named && first.wait > 0) {
		// An answer that ends the call, or parks the host, comes back at
		// once, its body unread; hedges getting ready are let go, those
		// in flight cancelled.
		h.end(nil)
		first.n = 1 + h.sent
		return h.keep(&first, plain)
	}
	// Failed while hedges may yet answer: wait for them (the caller's
	// context bounds them, as it bounds the attempt), and for those due
	// meanwhile.
	g := h.await()
	h.end(g)
	if g == nil {
		// No hedge was in flight: the failure is the call's, to retry.
		first.n = 1 + h.sent
		return h.keep(&first, plain)
	}
	drain(first.resp)
	h.ctx.cancel()
	return h.answer(c, g)
}

// await waits, the first having failed, for the hedges in flight: it
// returns the first whose answer needs no retry, else the last that
// failed, or nil when none was sent.
func (h *hedger) await() *hedgeAttempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.winner == nil && h.inFlight() > 0 {
		h.mu.Unlock()
		<-h.wake
		h.mu.Lock()
	}
	// Over from here, under the lock that saw nothing in flight: a hedge
	// getting ready now is let go (fire checks over before it sends), not
	// sent behind a verdict that counted the attempts without it.
	h.over = true
	if h.winner != nil {
		return h.winner
	}
	return h.lastOver
}

// inFlight counts the hedges sent and not answered. h.mu is held.
func (h *hedger) inFlight() int {
	n := 0
	for i := range h.fired {
		if h.hedges[i].state == hedgeSent {
			n++
		}
	}
	return n
}

// end is the end of the call's hedging: no more hedges go; those getting
// ready and those in flight are cancelled, and those answered, but keep,
// closed. It waits for those getting ready to let go (a pace slot given
// back, a report made), so that nothing of theirs outlives the call;
// those in flight clean up after themselves once their base lets go.
func (h *hedger) end(keep *hedgeAttempt) {
	h.mu.Lock()
	h.over = true
	h.mu.Unlock()
	h.timer.Stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		ready := 0
		for i := range h.fired {
			switch g := &h.hedges[i]; {
			case g == keep:
			case g.state == hedgeReady:
				ready++
				g.cancel()
			case g.state == hedgeSent:
				g.cancel()
			case g.sent && !g.cleaned:
				g.cleaned = true
				h.t.cleanUp(h.req.Context(), h.host, g.adm, g.resp) // failed or lost: its charge stays spent
				g.cancel()
			}
		}
		if ready == 0 {
			return
		}
		h.mu.Unlock()
		<-h.wake
		h.mu.Lock()
	}
}

// poke tells the caller a hedge changed. h.mu is held.
func (h *hedger) poke() {
	select {
	case h.wake <- struct{}{}:
	default: // a poke not yet seen covers this one
	}
}

// keep hands back the first attempt's answer, observed: its context lives
// until its body is closed.
func (f *hedgeFirst) keep(first *answer, plain bool) (answer, bool) {
	switch resp := first.resp; {
	case resp == nil:
		f.ctx.cancel()
	case isReadWriter(resp.Body):
		resp.Body = bodyWithCancel(resp.Body, f.ctx.cancel)
	default:
		f.body = firstBody{ReadCloser: resp.Body, ctx: &f.ctx}
		resp.Body = &f.body
	}
	return *first, plain
}

// answer hands back hedge g's answer, observed, as the call's last attempt:
// a plain success paid for itself, any other answer's charge is the
// call's, as a retry's would be.
func (h *hedger) answer(c *call, g *hedgeAttempt) (answer, bool) {
	a := answer{n: 1 + h.sent, resp: g.resp, err: g.err, adm: g.adm}
	plain := !c.observe(&a)
	if g.charged {
		if plain {
			c.t.budget.refund(g.spentAt)
		} else {
			c.charge(g.spentAt)
		}
	}
	if a.resp != nil {
		a.resp.Body = bodyWithCancel(a.resp.Body, g.cancel)
	} else {
		g.cancel()
	}
	return a, plain
}

// learn keeps the latency of an answer that says the host served it, for
// the learned hedge delay: from at, when its attempt was let go, to now;
// in r, when it is the host's record.
func (h *hedger) learn(r *hostLatencies, resp *http.Response, at time.Time) {
	lt := h.t.latencies
	if lt == nil || resp == nil || !h.timed {
		return
	}
	if code := resp.StatusCode; code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests {
		return // a failure or a refusal: its time says nothing of the host's latency
	}
	var d time.Duration
	if _, real := h.t.clock.(realClock); real {
		d = time.Since(at) // the monotonic clock alone: half the cost of a time.Now
	} else {
		d = h.t.clock.Now().Sub(at)
	}
	lt.add(h.req.URL.Host, r, d, at.Add(d))
}

// fire is a hedge, on the timer's goroutine: admitted through the host's
// pace and parking, then given its budget, its body and its report, and
// sent, unless an answer came meanwhile. Once sent, the timer is set for
// the next hedge, should this one be slow too.
func (h *hedger) fire() {
	h.mu.Lock()
	if h.early() || h.over {
		h.mu.Unlock()
		return
	}
	t := h.t
	if h.hedgeSet == nil {
		h.hedgeSet = &hedgeSet{wake: make(chan struct{}, 1), host: hostKey(h.req.URL)}
	}
	if h.winner != nil || 1+h.fired >= int(h.limit) {
		if h.winner == nil && !h.firstIn && h.inFlight() == h.fired {
			// Every attempt is still unanswered, and no more may go: said,
			// under the lock, so that it is done before the call returns.
			t.reportNoHedge(h.req.Context(), h.req, h.key, h.host, 1+h.fired, h.delay, ReasonAttempts)
		}
		h.mu.Unlock()
		return
	}
	g := &h.hedges[h.fired]
	h.fired++
	g.n = 1 + h.fired
	// From the first's parent, not from h.base's context: the base
	// request may be the first's own (markedHedger), on the first's
	// context, which ends when a hedge wins.
	ctx, cancel := context.WithCancel(context.WithValue(h.ctx.Context, resendKey{}, g.n-1))
	g.state, g.cancel = hedgeReady, cancel
	h.mu.Unlock()

	adm, err := t.admit(ctx, h.host, t.clock.Now())
	if err != nil {
		h.unsent(g, refusalReason(err))
		return
	}
	now := t.clock.Now()
	charged := t.budget != nil
	if charged && !t.budget.tryRetry(now) {
		t.giveBack(h.req.Context(), h.host, adm)
		h.unsent(g, ReasonBudget)
		return
	}
	req := h.base.WithContext(ctx)
	if h.base.Body != nil && h.base.Body != http.NoBody {
		body, err := h.req.GetBody()
		if err != nil {
			if charged {
				t.budget.refund(now)
			}
			t.giveBack(h.req.Context(), h.host, adm)
			h.unsent(g, ReasonGetBody)
			return
		}
		req.Body = body
	}
	h.mu.Lock()
	if h.over || h.winner != nil { // an answer came while it got ready
		h.mu.Unlock()
		closeBody(req)
		if charged {
			t.budget.refund(now)
		}
		t.giveBack(h.req.Context(), h.host, adm)
		cancel()
		h.mu.Lock()
		g.state = hedgeOver
		h.poke()
		h.mu.Unlock()
		return
	}
	g.state, g.sent, g.adm, g.charged, g.spentAt = hedgeSent, true, adm, charged, now
	h.sent++
	// Reported under the lock: a first answer that comes meanwhile waits
	// for the hooks, which are done before the call returns.
	t.reportHedge(h.req.Context(), h.req, h.key, h.host, g.n-1, h.delay)
	// The next hedge, should this one be slow too; past the last one
	// allowed, the report that no more go.
	h.timer.Reset(h.delay)
	h.mu.Unlock()

	if t.budget == nil && !t.noLearning {
		t.sent.add(adm.at)
	}
	resp, err := t.attempt(req, g.n, h.timeout)
	h.learn(nil, resp, adm.at)
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.poke()
	if h.over {
		t.cleanUp(h.req.Context(), h.host, adm, resp)
		cancel()
		g.state, g.cleaned = hedgeOver, true
		return
	}
	g.resp, g.err, g.state = resp, err, hedgeOver
	judge := call{t: t, ctx: h.req.Context(), req: h.req, retryIf: h.retryIf}
	if judge.retryable(&answer{resp: resp, err: err, now: t.clock.Now()}) {
		h.lastOver = g
		return
	}
	if h.winner == nil {
		h.winner = g
		if !h.firstIn {
			// The caller waits in the first attempt: end it. One that
			// answered already keeps its context, whose body the caller
			// may get.
			h.ctx.cancel()
		}
	}
}

// unsent ends a hedge that was not sent, and reports why, unless an
// answer came meanwhile or the caller gave up. The report is made before
// the hedge is over, so that it is done before the call returns.
func (h *hedger) unsent(g *hedgeAttempt, reason Reason) {
	g.cancel()
	h.mu.Lock()
	over := h.over || h.winner != nil
	h.mu.Unlock()
	if !over && h.req.Context().Err() == nil {
		h.t.reportNoHedge(h.req.Context(), h.req, h.key, h.host, g.n-1, h.delay, reason)
	}
	h.mu.Lock()
	g.state = hedgeOver
	h.poke()
	h.mu.Unlock()
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

// latencyOnly is what the limiter hears of an answer under
// WithLearning(false): nothing, but the ticket of an attempt that holds
// one, given back as saying nothing. (The learned hedge delay's latencies
// are the hedger's own: hedgelatency.go.)
func (c *call) latencyOnly(sig *Signal, _ outcome, report bool) {
	if report {
		c.t.limiter.Learn(c.ctx, c.hostName(), Signal{Now: sig.Now, Ticket: sig.Ticket, Reset: -1, Remaining: -1, Canceled: true})
	}
}

// firstCtx is a hedged call's first attempt's context: the caller's,
// ended when a hedge's answer wins or the first's body is closed. It
// lives in the hedger, so that the call makes no context of its own (a
// cancelCtx and its CancelFunc); its Done channel is made when asked for,
// and the contexts made from it (net/http's, the attempt timeout's) hook
// on to it through its AfterFunc, as they would on a cancelCtx, with no
// goroutine to watch it.
type firstCtx struct {
	context.Context // the caller's
	mu              sync.Mutex
	done            chan struct{}
	err             error
	after           []*func()
	stop            func() bool // unhooks it from the caller's context
}

func (c *firstCtx) init(parent context.Context) {
	c.Context = parent
	if parent.Done() != nil {
		c.stop = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	}
}

// Done is closed once the context ends.
func (c *firstCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

// Err is why the context ended, nil until it does.
func (c *firstCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// AfterFunc runs f on its own goroutine once the context ends, as
// context.AfterFunc does; context.WithCancel and its kin use it to hook
// on to the context.
func (c *firstCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	p := &f
	c.after = append(c.after, p)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.after, p)
		if i >= 0 {
			c.after = slices.Delete(c.after, i, i+1)
		}
		return i >= 0
	}
}

// cancel ends the context, and lets go of the caller's.
func (c *firstCtx) cancel() {
	c.end(context.Canceled)
	if c.stop != nil {
		c.stop()
	}
}

func (c *firstCtx) end(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, f := range after {
		go (*f)()
	}
}

// firstBody is the first attempt's body when it is the call's answer: its
// Close ends the attempt's context.
type firstBody struct {
	io.ReadCloser
	ctx *firstCtx
}

func (b *firstBody) Close() error {
	err := b.ReadCloser.Close()
	b.ctx.cancel()
	return err
}
