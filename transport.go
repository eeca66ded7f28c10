package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"golang.org/x/time/rate"
)

// Transport is an http.RoundTripper that paces, retries and parks. Make one
// with New; it is safe for concurrent use and cannot be changed afterwards.
type Transport struct {
	base                    http.RoundTripper
	maxAttempts             int
	backoffBase, backoffMax time.Duration
	raFloor, raMax          time.Duration
	statuses                statusSet
	pace                    Pace
	hostPace                map[string]Pace
	limiter                 Limiter
	budget                  *Budget
	autoKey                 bool
	onRetry                 func(RetryEvent)
	logger                  *slog.Logger
	rand                    func() float64
	clock                   Clock
	// markNested is set when the base may lead to another Transport of
	// ours: the request's context is then marked so that the inner one
	// makes one attempt and leaves the retries to this one.
	markNested bool
	// inner is the base when it is a Transport of ours: it is called
	// directly for one attempt, with no mark needed.
	inner *Transport
	// free is the in-process limiter when no host is paced: an attempt is
	// then admitted by one atomic load while nothing is parked.
	free *localLimiter
}

// New returns a Transport configured by opts; without options it retries
// idempotent requests up to 3 tries with full-jitter backoff, obeys
// Retry-After between 1 s and 60 s, keeps to a budget of 10 % retries, and
// paces nothing. New starts no goroutine.
func New(opts ...Option) *Transport {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	t := &Transport{
		base:        c.base,
		maxAttempts: c.maxAttempts,
		backoffBase: c.backoffBase,
		backoffMax:  c.backoffMax,
		raFloor:     c.raFloor,
		raMax:       c.raMax,
		pace:        c.pace,
		hostPace:    c.hostPace,
		limiter:     c.limiter,
		budget:      c.budget,
		autoKey:     c.autoKey,
		onRetry:     c.onRetry,
		logger:      c.logger,
		rand:        c.rand,
		clock:       c.clock,
	}
	if t.base == nil {
		t.base = cleanhttp.DefaultPooledTransport()
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
	if t.maxAttempts < 1 {
		t.maxAttempts = DefaultMaxAttempts
	}
	if t.backoffBase <= 0 {
		t.backoffBase = DefaultBackoffBase
	}
	if t.backoffMax <= 0 {
		t.backoffMax = DefaultBackoffMax
	}
	t.backoffMax = max(t.backoffMax, t.backoffBase)
	if t.raFloor <= 0 {
		t.raFloor = DefaultRetryAfterFloor
	}
	if t.raMax <= 0 {
		t.raMax = DefaultRetryAfterMax
	}
	t.raMax = max(t.raMax, t.raFloor)
	if c.statuses != nil {
		t.statuses = newStatusSet(*c.statuses)
	} else {
		t.statuses = newStatusSet(defaultStatuses)
	}
	if t.pace == (Pace{}) {
		t.pace = Pace{Limit: rate.Inf}
	}
	if t.clock == nil {
		t.clock = realClock{}
	}
	if t.limiter == nil {
		t.limiter = newLocalLimiter(t.clock)
	}
	if !c.budgetSet {
		t.budget = NewBudget(0.1, 1)
	}
	if t.rand == nil {
		t.rand = rand.Float64
	}
	if l, ok := t.limiter.(*localLimiter); ok && t.pace.Unlimited() && len(t.hostPace) == 0 {
		t.free = l
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

// nestedKey marks a request's context as already inside a retryhttp
// Transport, so that Transports nested below it make one attempt each.
type nestedKey struct{}

// markedBackground is context.Background() with the nesting mark, made once:
// a request without a context of its own is marked without an allocation.
var markedBackground = context.WithValue(context.Background(), nestedKey{}, true)

// RoundTrip sends req, retrying as the Transport's rules allow, and returns
// the last response untouched, or a *RetryError when the last try ended in
// an error. It never modifies req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Context().Value(nestedKey{}) != nil {
		return t.roundTripOnce(req)
	}
	c := call{t: t, req: req, ctx: req.Context(), start: t.clock.Now()}
	return c.run()
}

// roundTripOnce is the attempt of a Transport nested in another: it paces
// and parks like any, and leaves the retries and the budget to the outer.
func (t *Transport) roundTripOnce(req *http.Request) (*http.Response, error) {
	host := hostKey(req.URL)
	if err := t.admit(req.Context(), host, t.clock.Now()); err != nil {
		closeBody(req)
		return nil, err
	}
	var (
		resp *http.Response
		err  error
	)
	switch {
	case t.inner != nil:
		resp, err = t.inner.roundTripOnce(req)
	case t.markNested && req.Context().Value(nestedKey{}) == nil:
		// Called directly by an outer Transport, which did not mark the
		// request: mark it now, for a Transport behind this unknown base.
		resp, err = t.base.RoundTrip(req.WithContext(context.WithValue(req.Context(), nestedKey{}, true)))
	default:
		resp, err = t.base.RoundTrip(req)
	}
	if resp != nil && t.namesWait(resp) {
		now := t.clock.Now()
		if w, ok := t.serverWait(resp, now); ok {
			t.park(req.Context(), host, now, max(w, t.raFloor))
		}
	}
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
	trace *sendTrace    // set for requests that are not replayable
}

// hostName is the host the call goes to, made on first use: the success
// path needs none.
func (c *call) hostName() string {
	if c.host == "" {
		c.host = hostKey(c.req.URL)
	}
	return c.host
}

func (c *call) run() (*http.Response, error) {
	t := c.t
	c.prepare()
	if !t.admitted(c.start) {
		if err := t.admit(c.ctx, c.hostName(), c.start); err != nil {
			closeBody(c.req)
			return nil, err
		}
	}
	var (
		resp *http.Response
		err  error
	)
	for n := 1; ; n++ {
		areq := c.base
		if n > 1 {
			if areq, err = c.rewind(); err != nil {
				return c.refuse(n-1, nil, err, reasonGetBody)
			}
		}
		if c.trace != nil {
			c.trace.reset()
		}
		if n == 1 && t.budget != nil {
			t.budget.recordFirst(c.start)
		}
		if t.inner != nil {
			resp, err = t.inner.roundTripOnce(areq)
		} else {
			resp, err = t.base.RoundTrip(areq)
		}
		if err != nil && resp != nil {
			resp.Body.Close() // a base breaking the RoundTripper contract
			resp = nil
		}
		if err == nil && resp == nil {
			err = errors.New("retryhttp: base RoundTripper returned neither a response nor an error")
		}
		delay, ok := c.decide(n, resp, err)
		if !ok {
			return c.finish(n, resp, err)
		}
		c.report(n, resp, err, delay, "")
		t.drain(resp)
		if werr := t.clock.Sleep(c.ctx, delay); werr != nil {
			return nil, c.fail(n, fmt.Errorf("retryhttp: cancelled while waiting to retry: %w", werr))
		}
		if now := t.clock.Now(); !t.admitted(now) {
			if aerr := t.admit(c.ctx, c.hostName(), now); aerr != nil {
				return nil, c.fail(n, aerr)
			}
		}
	}
}

// prepare builds what every attempt sends: the caller's request itself when
// nothing must change, which is the common case for a GET.
func (c *call) prepare() {
	t, req := c.t, c.req
	c.base = req
	ctx := c.ctx
	if t.markNested {
		if ctx == context.Background() {
			ctx = markedBackground
		} else {
			ctx = context.WithValue(ctx, nestedKey{}, true)
		}
	}
	needKey := t.autoKey && wantsAutoKey(req)
	if t.maxAttempts > 1 && !needKey && !replayable(req) {
		c.trace = newSendTrace()
		ctx = httptrace.WithClientTrace(ctx, &c.trace.trace)
	}
	if ctx == c.ctx && !needKey {
		return
	}
	r := req.WithContext(ctx)
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

// rewind returns the request for a retry, with a fresh body from GetBody.
func (c *call) rewind() (*http.Request, error) {
	if c.req.Body == nil || c.req.Body == http.NoBody {
		return c.base, nil
	}
	body, err := c.req.GetBody()
	if err != nil {
		return nil, err
	}
	r := new(http.Request)
	*r = *c.base
	r.Body = body
	return r, nil
}

// decide says whether the failure of try n is retried, and after what wait.
// A refused retry is reported here, with its reason.
func (c *call) decide(n int, resp *http.Response, err error) (time.Duration, bool) {
	t := c.t
	var (
		now        time.Time
		serverWait time.Duration
		named      bool
	)
	if resp != nil {
		if !t.retryStatus(resp.StatusCode) && !t.namesWait(resp) {
			return 0, false // the success path: no clock reading, no parsing
		}
		now = t.clock.Now()
		serverWait, named = t.serverWait(resp, now)
		if named && serverWait > 0 {
			t.park(c.ctx, c.hostName(), now, max(serverWait, t.raFloor))
		}
		if !t.retryStatus(resp.StatusCode) {
			return 0, false
		}
	} else if !transientError(c.ctx, err) {
		return 0, false
	} else {
		now = t.clock.Now()
	}
	if t.maxAttempts == 1 || c.ctx.Err() != nil {
		return 0, false
	}
	refuse := func(reason string) (time.Duration, bool) {
		c.report(n, resp, err, 0, reason)
		return 0, false
	}
	switch {
	case n >= t.maxAttempts:
		return refuse(reasonAttempts)
	case !c.repeatable(resp, err):
		return refuse(reasonIdempotent)
	case !rewindable(c.req):
		return refuse(reasonRewind)
	case named && serverWait > t.raMax:
		return refuse(reasonServerWait)
	}
	delay := c.backoff(n)
	if named {
		delay = max(serverWait, t.raFloor)
	}
	if dl, ok := c.ctx.Deadline(); ok && now.Add(delay).After(dl) {
		return refuse(reasonDeadline)
	}
	if t.budget != nil && !t.budget.tryRetry(now) {
		return refuse(reasonBudget)
	}
	return delay, true
}

// repeatable reports whether the request may be sent again after this
// failure: always if it is replayable, else only if the server certainly did
// not act on it (a 429, or an attempt that was never sent).
func (c *call) repeatable(resp *http.Response, err error) bool {
	if c.key != "" || replayable(c.req) {
		return true
	}
	if resp != nil {
		return resp.StatusCode == http.StatusTooManyRequests
	}
	return !mayHaveSent(err, c.trace)
}

// backoff is full jitter: uniform(0, min(max, base*2^(n-1))) after the nth
// failure.
func (c *call) backoff(n int) time.Duration {
	t := c.t
	ceiling := t.backoffBase
	for i := 1; i < n && ceiling < t.backoffMax; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, t.backoffMax)
	r := t.rand()
	if !(r >= 0) {
		r = 0
	}
	if r >= 1 {
		r = 0.9999999999999999
	}
	return time.Duration(r * float64(ceiling))
}

// finish returns the outcome of the last try.
func (c *call) finish(n int, resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, c.fail(n, err)
	}
	return resp, nil
}

// refuse ends the call when a retry could not be prepared.
func (c *call) refuse(n int, resp *http.Response, err error, reason string) (*http.Response, error) {
	c.report(n, resp, err, 0, reason)
	return nil, c.fail(n, err)
}

// drainLimit is how much of a retried response's body is read so that its
// connection can be reused; a longer body costs less to drop than to read.
const drainLimit = 64 << 10

// drainTime bounds how long a retried response's body is read: a
// connection is worth a few milliseconds, not the time a server takes to
// trickle a body nobody will read.
const drainTime = 50 * time.Millisecond

// drain reads what is left of a retried response's body, up to drainLimit,
// and closes it, so that a keep-alive connection goes back to the pool.
// When the base is net/http's Transport, whose bodies may be closed while a
// read is blocked, the read is cut short after drainTime.
func (t *Transport) drain(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	if resp.ContentLength < 0 || resp.ContentLength <= drainLimit {
		if _, ok := t.base.(*http.Transport); ok {
			stop := time.AfterFunc(drainTime, func() { resp.Body.Close() })
			defer stop.Stop()
		}
		// One byte past the limit, so that a body of exactly the limit is
		// read to its EOF, which is what frees the connection.
		io.CopyN(io.Discard, resp.Body, drainLimit+1)
	}
	resp.Body.Close()
}

// closeBody honours the RoundTripper contract for a request never sent: its
// body is closed all the same.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
