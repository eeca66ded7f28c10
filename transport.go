package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync/atomic"
	"time"
)

// Transport is an http.RoundTripper that paces, retries and parks. Make one
// with New; it is safe for concurrent use and cannot be changed afterwards.
type Transport struct {
	config
	// markNested is set when the base may lead to another Transport of
	// ours: the request passed down is then marked, so that the inner one
	// makes one attempt and leaves the retries to this one.
	markNested bool
	// inner is the base when it is a Transport of ours: it is called
	// directly for one attempt, with no mark needed.
	inner *Transport
	// free is the in-process limiter when no host is paced by
	// configuration: an attempt is then admitted by two atomic loads while
	// nothing is parked or learned.
	free *localLimiter
	// local is the in-process limiter whenever it is the Transport's
	// (configured pace or not): it is asked directly, given the host's
	// hash and the entry its reservation found, which the Limiter
	// interface has no room for.
	local *localLimiter
	// sent counts this Transport's attempts, all hosts, in one-second
	// buckets, when it has no budget to count its first tries: what a host
	// that starts refusing can have got at most.
	sent lazyCounter
	// inflight counts this Transport's attempts waiting for their
	// headers, all hosts: what a host that just got a record can have of
	// ours on its way at most (Signal.InFlight).
	inflight atomic.Int64
	// mono says the clock is the real one: an answer's time is then read
	// from the monotonic clock alone, counted from its attempt's send
	// (answeredAt).
	mono bool
	// latencies are the hosts' recent latencies, for a learned hedge
	// delay (WithHedging(0)); nil otherwise.
	latencies *latencyTable
	// hedgers are the hedgers and timers of calls answered before their
	// hedge, handed on to the next (hedgetimer.go).
	hedgers hedgerPool
}

// New returns a Transport configured by opts; without options it retries
// idempotent requests up to 3 tries with full-jitter backoff, obeys
// Retry-After between 1 s and 60 s, keeps to a budget of 10 % retries, and
// paces a host only once it announces a quota or refuses. New starts no
// goroutine.
func New(opts ...Option) *Transport {
	t := &Transport{config: newConfig(opts)}
	_, t.mono = t.clock.(realClock)
	if t.hedging && t.hedgeDelay == 0 {
		t.latencies = newLatencyTable()
	}
	// A base that is a plain *http.Transport cannot lead to another
	// Transport of ours, and one that is ours is called directly for a
	// single attempt; only an unknown base needs the context mark.
	switch b := t.base.(type) {
	case *http.Transport:
	case *Transport:
		t.inner = b
	default:
		t.markNested = true
	}
	switch l := t.limiter.(type) {
	case *localLimiter:
		l.logger = t.logger // made by newConfig for this Transport alone
		t.local = l
		if t.pace.Unlimited() && len(t.hostPace) == 0 {
			t.free = l
		}
	case *sharedLimiter:
		l.local.logger = t.logger
	}
	return t
}

// NewClient returns an http.Client whose Transport is New(opts...).
func NewClient(opts ...Option) *http.Client {
	return &http.Client{Transport: New(opts...)}
}

// CloseIdleConnections closes the idle connections of the base, if it has
// a CloseIdleConnections method.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := t.base.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
}

// RoundTrip sends req, retrying as the Transport's rules allow, and returns
// the last response untouched, or a *RetryError when the last try ended in
// an error. It never modifies req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if passedDown(req) {
		return t.roundTripOnce(req)
	}
	c := call{t: t, req: req, ctx: req.Context()}
	return c.run()
}

// roundTripOnce is the attempt of a Transport nested in another: it paces,
// parks and learns like any, and leaves the retries and the budget to the
// outer.
func (t *Transport) roundTripOnce(req *http.Request) (*http.Response, error) {
	c := call{t: t, req: req, ctx: req.Context(), retryIf: t.retryIf, attemptTimeout: t.attemptTimeout, nested: true}
	if !t.calm(&c) {
		now := t.clock.Now()
		c.adm.at = now
		if !t.admitted(now) {
			var err error
			if c.adm, err = t.admit(c.ctx, c.hostName(), now); err != nil {
				closeBody(req)
				return nil, err
			}
		}
	}
	if t.markNested {
		req = req.WithContext(&passedDownCtx{Context: req.Context(), method: methodOf(req), url: req.URL})
	}
	resp, err := c.send(req, 1, c.adm.at)
	c.observe(&answer{n: 1, resp: resp, err: err, adm: c.adm})
	return resp, err
}

// call is one RoundTrip: the caller's request and what the retries need.
type call struct {
	t     *Transport
	req   *http.Request
	ctx   context.Context // the caller's
	host  string          // made by hostName when first needed
	start time.Time
	key   string        // WithAutoIdempotencyKey's key, made once
	base  *http.Request // req with what every attempt shares: the key, the marks
	// baseCtx is the context every attempt's is made from: base's, which
	// a hedged first attempt may take for its own (markedHedger).
	baseCtx context.Context
	trace   *sendTrace // set for requests that are not replayable
	adm     admission  // the attempt in flight: when it was let go, and its ticket
	replay  *replay    // the body, when it has no GetBody and may be sent again
	// spent is when the call's retries spent the budget (the last
	// len(spent) of them), nSpent how many did: if the call succeeds, they
	// paid for themselves. charged says the retry in flight is the last.
	spent   [4]time.Time
	nSpent  int
	charged bool
	// maxAttempts, retryIf and attemptTimeout are the Transport's, or
	// the request's policy (ContextWithPolicy).
	maxAttempts    int
	retryIf        func(*http.Response, error) bool
	attemptTimeout time.Duration
	// nested is set for the one attempt of a Transport nested in another.
	nested bool
	// unheld is set for a call whose first try went undated while other
	// hosts held entries and its own held none (calm.go), hash its host's.
	unheld bool
	hash   uint32
	// lat is the host's latencies, for a learned hedge delay, found by
	// hedgeAfter: the first attempt's answer is added to them.
	lat   *hostLatencies
	timed bool // its attempts' latencies are to be learned (hostLatencies.timed)
	// hedgeAt is the reading of the real clock that hedgeAfter made for
	// a calm or unheld call with a learned delay: its timer's and its
	// first attempt's start.
	hedgeAt time.Time
	hedge   bool // its first attempt is hedged (mayHedge)
	// spare is the first attempt's hedgeFirst made with the marked
	// request (newMarked), for hedged to use.
	spare *hedgeFirst
}

// hostName is the host the call goes to, made on first use: the success
// path needs none.
func (c *call) hostName() string {
	if c.host == "" {
		c.host = hostKey(c.req.URL)
	}
	return c.host
}

// hostHash is the hash of the call's host (hostHash), made with its name:
// in one pass over a bare name, which is its own key.
func (c *call) hostHash() uint32 {
	if c.host == "" && c.req.URL != nil {
		if h, ok := bareHash(c.req.URL.Host); ok {
			c.host = c.req.URL.Host
			return h
		}
	}
	return hostHash(c.hostName())
}

// run is the attempt loop. After each try, in this order: observe the
// answer (park the host, tell the limiter what it says of the host's
// capacity), decide (no side effects), and then either hand the answer back
// or carry out the retry (budget, wait, admission, report, send).
func (c *call) run() (*http.Response, error) {
	t := c.t
	c.prepare()
	if c.replay != nil {
		defer c.replay.finish()
	}
	calm := t.calm(c)
	c.unheld = !calm && t.unheld(c)
	if calm || c.unheld {
		// Nothing held for any host, or for this one: admitted at once,
		// and no clock read (calm.go). c.start and c.adm.at stay zero
		// until an answer needs them (observe).
		if t.budget != nil {
			c.countUndated(&t.budget.firsts)
		}
	} else {
		now := t.clock.Now()
		c.start, c.adm.at = now, now
		// A host found holding an entry (c.hash made: unheld) is the
		// limiter's to admit at once (admitAfter's unasked).
		if unasked := c.hash != 0; unasked || !t.admitted(now) {
			var err error
			if c.adm, err = t.admitAfter(c.ctx, c.hostName(), admission{hash: c.hash}, now, unasked); err != nil {
				closeBody(c.req)
				return nil, err
			}
		}
		if t.budget != nil {
			t.budget.recordFirst(c.adm.at) // when the try is made, not when RoundTrip was called
		}
	}
	areq := c.base
	for n := 1; ; n++ {
		var (
			a     answer
			plain bool
		)
		var d time.Duration
		if n == 1 && t.hedging {
			d = c.hedgeAfter()
		}
		if d > 0 {
			a, plain = c.hedged(areq, d)
			n = a.n
		} else {
			resp, err := c.send(areq, n, c.adm.at)
			a = answer{n: n, resp: resp, err: err, adm: c.adm}
			plain = !c.observe(&a)
		}
		if plain {
			c.paidFor()
			return a.resp, nil // a plain success
		}
		v := c.decide(&a)
		if !v.retry {
			if v.reason != "" {
				c.giveUp(&a, v.reason)
			} else {
				c.paidFor() // not worth another try: the retry got its answer
			}
			return c.finish(n, a.resp, a.err, v.reason)
		}
		next, reason, ferr := c.retry(&a, v)
		switch {
		case ferr != nil:
			return nil, c.fail(n, ferr, "")
		case reason != "":
			c.giveUp(&a, reason)
			return c.finish(n, a.resp, a.err, reason)
		}
		areq = next
	}
}

// paidFor refunds the budget for the call's retries once it got its
// answer: retries that end in success pay for themselves, as the AWS SDKs'
// retry quota refunds them. What the budget bounds is retries that fail to
// the end, which an outage makes: a host that fails one answer in three
// at random gets every retry that a request needs.
func (c *call) paidFor() {
	for i := range min(c.nSpent, len(c.spent)) {
		c.t.budget.refund(c.spent[i])
	}
	c.nSpent, c.charged = 0, false
}

// charge records the retry in flight's spending of the budget at now.
func (c *call) charge(now time.Time) {
	c.spent[c.nSpent%len(c.spent)] = now
	c.nSpent++
	c.charged = true
}

// uncharge refunds the retry in flight's spending: it was not sent.
func (c *call) uncharge() {
	if c.charged {
		c.nSpent--
		c.t.budget.refund(c.spent[c.nSpent%len(c.spent)])
		c.charged = false
	}
}

// send makes one attempt through the base, and holds the base to the
// RoundTripper contract.
func (c *call) send(req *http.Request, n int, now time.Time) (*http.Response, error) {
	t := c.t
	if c.trace != nil {
		c.trace.reset()
	}
	if (t.budget == nil || c.nested) && !t.noLearning {
		// The budget counts first tries otherwise (see sentLastSecond);
		// a nested call's first tries are the outer's to count. A calm
		// call's first try has no time: it is counted undated.
		if now.IsZero() {
			c.countUndated(&t.sent)
		} else {
			t.sent.add(now)
		}
	}
	return t.attempt(req, n, c.attemptTimeout)
}

// attempt is attempt n through the base, under the attempt timeout when
// there is one.
func (t *Transport) attempt(req *http.Request, n int, timeout time.Duration) (*http.Response, error) {
	t.inflight.Add(1)
	defer t.inflight.Add(-1)
	if timeout > 0 {
		return t.timedRoundTrip(req, n, timeout)
	}
	return t.roundTrip(req)
}

// roundTrip is one attempt through the base, held to the RoundTripper
// contract.
func (t *Transport) roundTrip(req *http.Request) (*http.Response, error) {
	var (
		resp *http.Response
		err  error
	)
	switch {
	case t.inner != nil:
		resp, err = t.inner.roundTripOnce(req)
	default:
		resp, err = t.base.RoundTrip(req)
	}
	if err != nil && resp != nil {
		resp.Body.Close() // a base breaking the RoundTripper contract
		resp = nil
	}
	if err == nil && resp == nil {
		err = errors.New("retryhttp: base RoundTripper returned neither a response nor an error")
	}
	if resp != nil && resp.Body == nil {
		// A base may leave Body nil (an http.Client never does): the
		// caller, and every wrapper of ours, reads and closes it (R19).
		resp.Body = http.NoBody
	}
	return resp, err
}

// retry carries out a verdict to retry try a.n: it spends the budget, keeps
// the failed response for the caller while waiting out the delay and the
// host's admission, reports the retry and returns the request for the next
// try. When the retry cannot happen after all, it returns why, with a.resp
// still whole for the caller; err is set only when the context ended the
// wait (the response is closed then).
func (c *call) retry(a *answer, v verdict) (next *http.Request, reason Reason, err error) {
	t := c.t
	// A retry the server scheduled (it named the wait) is not a storm: the
	// budget is for the retries nobody asked for. Nor is one that waits
	// for the pace the host model holds an overloaded host to: the model
	// schedules it. The budget is looked at now, and spent once the wait
	// is over: a retry waiting out its backoff holds no share of it, and
	// whether a refusal's retry waits for the model's pace is known only
	// then (the refusals of a burst come back before the model has seen
	// enough of them to tell overload from failure).
	c.charged = false // the retry that failed stays spent, unless the call succeeds
	charge := t.budget != nil && !v.scheduled && !a.paced
	if charge && !t.budget.canRetry(a.now) {
		return nil, ReasonBudget, nil
	}
	refund := c.uncharge
	if v.delay <= 0 && t.admitted(a.now) && c.replay == nil {
		// Nothing to wait for: the retry goes now, so the response need
		// not be kept, only drained for its connection.
		if charge && !c.spend(a.now, false) {
			return nil, ReasonBudget, nil
		}
		if next, reason = c.rewind(a.n); reason != "" {
			refund()
			return nil, reason, nil
		}
		drain(a.resp)
		c.logRetry(a, 0)
		c.notify(a, 0, "")
		c.adm = admission{at: a.now}
		return next, "", nil
	}
	c.logRetry(a, v.delay)
	held := hold(a.resp)
	if werr := t.clock.Sleep(c.ctx, v.delay); werr != nil {
		held.discard()
		refund()
		return nil, "", fmt.Errorf("retryhttp: cancelled while waiting to retry: %w", werr)
	}
	// The body first, which may wait for the base to let go of the last
	// one: admission must be the last thing before the send, so that a
	// parking set during any wait holds the retry.
	var woke time.Time // read only for a body to wait for: what it adds to the wait
	if c.replay != nil {
		woke = t.clock.Now()
	}
	if next, reason = c.rewind(a.n); reason != "" {
		refund()
		if cerr := c.ctx.Err(); cerr != nil { // ended the wait for the base to let go of the body
			held.discard()
			return nil, "", fmt.Errorf("retryhttp: cancelled while waiting to retry: %w", cerr)
		}
		return nil, reason, nil // a.resp goes back as held
	}
	now := t.clock.Now()
	if charge && !c.spend(now, a.refused) {
		closeBody(next)               // made ready, never sent
		return nil, ReasonBudget, nil // a.resp goes back as held
	}
	prev := c.adm
	c.adm = admission{at: now}
	// The attempt before was the limiter's to admit (prev.hash made): so
	// is this one, at once (admitAfter's unasked).
	if unasked := prev.hash != 0; unasked || !t.admitted(now) {
		if c.adm, err = t.admitAfter(c.ctx, c.hostName(), prev, now, unasked); err != nil {
			closeBody(next) // made ready, never sent
			if c.ctx.Err() != nil {
				held.discard()
				refund()
				return nil, "", err
			}
			refund()
			return nil, refusalReason(err), nil // a.resp goes back as held
		}
	}
	held.discard()
	waited := v.delay + c.adm.at.Sub(now) // the delay, then the pace and the parking
	if c.replay != nil {
		waited += now.Sub(woke) // and the base letting go of the body
	}
	c.notify(a, waited, "")
	return next, "", nil
}

// spend takes one retry from the budget, if it has one; a refusal's retry
// takes none when the host model now holds the host to a pace.
func (c *call) spend(now time.Time, refusal bool) bool {
	t := c.t
	if refusal && !t.noLearning {
		// The host's state, asked with the attempt's hash and entry:
		// the retry goes to the host the refused attempt went to.
		st, err := t.stateOf(c.ctx, c.hostName(), &c.adm, now)
		if err == nil && (st == HostOverloaded || st == HostRecovering) {
			return true
		}
	}
	if !t.budget.tryRetry(now) {
		return false
	}
	c.charge(now)
	return true
}

// refusalReason names why admission refused a retry.
func refusalReason(err error) Reason {
	var (
		paused *HostPausedError
		down   *HostDownError
		pace   *paceError
	)
	switch {
	case errors.As(err, &paused):
		return ReasonHostPaused
	case errors.As(err, &down):
		return ReasonHostDown
	case errors.As(err, &pace):
		return ReasonDeadline
	}
	return ReasonLimiter
}

// prepare builds what every attempt sends: the caller's request itself when
// nothing must change, which is the common case for a GET.
func (c *call) prepare() {
	t, req := c.t, c.req
	c.base = req
	ctx := c.ctx
	c.applyPolicy()
	needKey := t.autoKey && wantsAutoKey(req)
	if c.maxAttempts > 1 && req.GetBody == nil {
		c.replay = newReplay(req, t.replayLimit)
	}
	if c.maxAttempts > 1 && !needKey && !replayable(req) {
		c.trace = newSendTrace()
		ctx = httptrace.WithClientTrace(ctx, &c.trace.trace)
	}
	c.hedge = c.mayHedge(needKey)
	var slot *http.Request // where the marked request goes
	if t.markNested {
		// Marked for the Transport of ours that may lie behind this
		// unknown base; only this request, not others made with its
		// context (an auth wrapper fetching a token), is nested for it.
		var mark *passedDownCtx
		mark, slot = c.newMarked()
		*mark = passedDownCtx{Context: ctx, method: methodOf(req), url: req.URL}
		ctx = mark
	}
	if ResendCount(ctx) != 0 {
		// Another request's retry count, on a context this request was
		// made with (an auth wrapper below that Transport, fetching a
		// token): this request's first try is a first try.
		ctx = context.WithValue(ctx, resendKey{}, 0)
	}
	c.baseCtx = ctx
	if ctx == c.ctx && !needKey && c.replay == nil {
		return
	}
	var r *http.Request
	if slot != nil {
		// The request and its mark in one allocation: WithContext's copy
		// does not escape, and is copied in.
		on := ctx
		if f := c.spare; f != nil {
			// To be hedged: made on its first attempt's context at once
			// (markedHedger), which hedged sets going.
			f.ctx.Context = ctx
			on = &f.ctx
		}
		*slot = *req.WithContext(on)
		r = slot
	} else {
		r = req.WithContext(ctx)
	}
	if c.replay != nil {
		r.Body = c.replay.first()
	}
	if needKey {
		c.key = newIdempotencyKey()
		r.Header = req.Header.Clone()
		if r.Header == nil {
			r.Header = make(http.Header)
		}
		r.Header[headerIdempotencyKey] = []string{c.key}
	}
	c.base = r
}

// rewind returns the request for retry n (n = the tries so far), with a
// fresh body and the resend count on its context, or the reason it cannot
// be had.
func (c *call) rewind(n int) (*http.Request, Reason) {
	r := c.base.WithContext(context.WithValue(c.baseCtx, resendKey{}, n))
	switch {
	case c.req.Body == nil || c.req.Body == http.NoBody:
	case c.req.GetBody != nil:
		body, err := c.req.GetBody()
		if err != nil {
			return nil, ReasonGetBody
		}
		r.Body = body
	case c.replay != nil:
		body, ok := c.replay.next(c.ctx, c.t.clock)
		if !ok {
			return nil, ReasonNoRewind
		}
		r.Body = body
	default:
		return nil, ReasonNoRewind
	}
	return r, ""
}

// finish returns the outcome of the last try, not retried for reason.
func (c *call) finish(n int, resp *http.Response, err error, reason Reason) (*http.Response, error) {
	if err != nil {
		return nil, c.fail(n, err, reason)
	}
	return resp, nil
}

// closeBody honours the RoundTripper contract for a request never sent: its
// body is closed all the same.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// nestedKey is the context key of the mark a Transport puts on the request
// it passes down an unknown base.
type nestedKey struct{}

// markedRequest is a request passed down an unknown base and its context,
// made together.
type markedRequest struct {
	req http.Request
	ctx passedDownCtx
}

// passedDown is the context of a request a Transport passed down an unknown
// base: it names that request, so that a Transport of ours below treats it,
// and nothing else made with the same context, as nested.
type passedDownCtx struct {
	context.Context
	method string
	url    *url.URL
}

func (p *passedDownCtx) Value(key any) any {
	if key == (nestedKey{}) {
		return p
	}
	return p.Context.Value(key)
}

// passedDown reports whether req is a request that an outer Transport of
// ours passed down: its context is marked for it, and it goes where the
// marked request went (wrappers between the two may clone it, keeping the
// method and URL, but a request of their own goes elsewhere).
func passedDown(req *http.Request) bool {
	p, ok := req.Context().Value(nestedKey{}).(*passedDownCtx)
	if !ok {
		return false
	}
	if req.URL == p.url {
		return true
	}
	return req.URL != nil && p.url != nil && methodOf(req) == p.method &&
		hostKey(req.URL) == hostKey(p.url) && req.URL.Path == p.url.Path
}

// sentLastSecond is how many requests the Transport sent lately, to every
// host: the budget's count of first tries when it has a budget (shared, it
// counts those of every Transport sharing it, a bound all the same), so
// that the success path pays for one count, not two.
func (t *Transport) sentLastSecond(now time.Time) float64 {
	if t.budget != nil {
		// A Transport nested in another counts its attempts itself: the
		// outer's first tries are on the outer's budget.
		return max(t.budget.firsts.lastSecond(now), t.sent.lastSecond(now))
	}
	return t.sent.lastSecond(now)
}
