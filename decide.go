package retryhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// Whether a failed try is retried, and when, is decided here and nowhere
// else. decide is a function of the try, its answer, the request and the
// time: it parks nothing, spends no budget and reports nothing. The loop in
// transport.go applies what it says, in one fixed order.

// Reason says why a failed try that could have been retried was not: the
// Reason of a RetryEvent given to the WithOnGiveUp hook and of the log line.
type Reason string

// The reasons a retry is refused.
const (
	// ReasonAttempts: the request has had all its tries (WithMaxAttempts).
	ReasonAttempts Reason = "out of attempts"
	// ReasonBudget: the client-wide retry budget is spent (WithBudget).
	ReasonBudget Reason = "retry budget spent"
	// ReasonNotIdempotent: the request may have reached the server, and
	// its method and headers do not make it safe to send again.
	ReasonNotIdempotent Reason = "not idempotent"
	// ReasonNoRewind: the body cannot be sent again: it has no GetBody,
	// and it is no io.Seeker and is longer than the replay limit
	// (WithReplayLimit), or it failed, or the base did not close it.
	ReasonNoRewind Reason = "body cannot be sent again"
	// ReasonGetBody: GetBody returned an error.
	ReasonGetBody Reason = "GetBody failed"
	// ReasonServerWait: the server named a wait beyond the Retry-After max.
	ReasonServerWait Reason = "server wait beyond max"
	// ReasonDeadline: the wait, or the host's pace, would end after the
	// request's deadline.
	ReasonDeadline Reason = "wait ends after deadline"
	// ReasonHostPaused: while the retry waited, its host was parked until
	// a moment beyond the Retry-After max or the request's deadline.
	ReasonHostPaused Reason = "host paused"
	// ReasonLimiter: the Limiter failed when asked for the retry's slot.
	ReasonLimiter Reason = "limiter failed"
	// ReasonHostDown: the host is down (nothing got through to it lately):
	// it is tried again with one request every half second, not with
	// retries.
	ReasonHostDown Reason = "host down"
)

// verdict is what decide says of a failed try: retry after delay, or stop,
// with a reason when the failure was one worth retrying.
type verdict struct {
	retry bool
	delay time.Duration
	named bool // the delay is a wait the server named
	// scheduled is set when the server named a wait of its own, longer
	// than nothing: the retry is the server's, not the budget's.
	scheduled bool
	reason    Reason
}

// answer is a try and what it got: the input of decide.
type answer struct {
	n    int
	resp *http.Response
	err  error
	now  time.Time
	// wait is the wait the response names (Retry-After, or the reset of a
	// spent quota), valid when named.
	wait  time.Duration
	named bool
	// adm is the attempt's admission: when it went, and its ticket.
	adm admission
	// refused is set for a refusal (a 429, a 503 or 529 naming no wait);
	// down says the host model holds the host down after this answer;
	// paced, that it was a refusal of an overloaded host, whose retry
	// waits for the pace the model holds it to.
	refused, down, paced bool
}

// decide says whether the failure of try a.n is retried, and after what
// wait. It has no side effects.
func (c *call) decide(a *answer) verdict {
	t := c.t
	if !c.retryable(a) {
		return verdict{}
	}
	if c.maxAttempts == 1 {
		return verdict{} // retries are off: there is nothing to refuse
	}
	switch {
	case a.n >= c.maxAttempts:
		return verdict{reason: ReasonAttempts}
	case a.down:
		return verdict{reason: ReasonHostDown}
	case !c.repeatable(a):
		return verdict{reason: ReasonNotIdempotent}
	case !rewindable(c.req) && (c.replay == nil || !c.replay.possible()):
		return verdict{reason: ReasonNoRewind}
	case a.named && a.wait > t.raMax:
		return verdict{reason: ReasonServerWait}
	}
	v := verdict{retry: true, delay: c.backoff(a.n)}
	if timedOut(a.err) {
		v.delay = 0 // the attempt timeout was its wait
	}
	if a.named {
		v.delay, v.named, v.scheduled = max(a.wait, t.raFloor), true, a.wait > 0
	}
	if dl, ok := c.ctx.Deadline(); ok && a.now.Add(v.delay).After(dl) {
		return verdict{reason: ReasonDeadline}
	}
	return v
}

// retryable is the classification: the user's predicate or the default,
// under the rules no predicate overrides. A cancelled or expired context is
// final, and so is a refusal by a Transport of ours nested below this one
// (it already waited for the host as long as it could), and an answer whose
// server says X-Should-Retry: false.
func (c *call) retryable(a *answer) bool {
	resp, err := a.resp, a.err
	var worth bool
	switch {
	case err != nil && ownRefusal(err):
		return false
	case resp != nil && serverSaysNo(resp):
		return false
	case c.retryIf != nil:
		worth = c.retryIf(resp, err)
	case resp != nil:
		worth = worthRetrying(resp, &c.t.statuses, a.now)
	default:
		worth = transientError(c.ctx, err)
	}
	// Asked last: the success path needs no look at the context.
	return worth && c.ctx.Err() == nil
}

// DefaultRetryIf is the classification a Transport uses without
// WithRetryIf. A response is retried when its status is 408, 429, 500, 502,
// 503, 504, 520, 521, 522, 523 or 529, or when it is a 403 that refuses for a
// quota (a wait of a second or more, or a spent quota with its reset, as
// GitHub sends); X-Should-Retry overrides the status of a failure, "true"
// retrying it and "false" not. An error is retried when it may be transient
// (a refused or reset connection, a timeout, EOF, an HTTP/2 refused stream or
// GOAWAY; never a certificate error, a malformed address or a cancelled
// context). Compose it to extend the default:
//
//	retryhttp.WithRetryIf(func(resp *http.Response, err error) bool {
//		return retryhttp.DefaultRetryIf(resp, err) || (resp != nil && resp.StatusCode == http.StatusConflict)
//	})
func DefaultRetryIf(resp *http.Response, err error) bool {
	if err != nil {
		return transientError(context.Background(), err)
	}
	return resp != nil && worthRetrying(resp, &defaultStatusSet, time.Now())
}

var defaultStatusSet = newStatusSet(defaultStatuses)

// ownRefusal reports whether err is a Transport of ours declining to send:
// a parked or down host, or a pace slot beyond the deadline.
func ownRefusal(err error) bool {
	var (
		paused *HostPausedError
		down   *HostDownError
		pace   *paceError
	)
	return errors.As(err, &paused) || errors.As(err, &down) || errors.As(err, &pace)
}

// repeatable reports whether the request may be sent again after this
// failure: always if it is replayable, or the caller said it is safe to
// repeat, else only if the server certainly did not act on it (a 429, a 403
// refusing for a quota, an attempt that was never sent) or vouches that
// repeating it is harmless (X-Should-Retry: true).
func (c *call) repeatable(a *answer) bool {
	if c.key != "" || replayable(c.req) || c.safeToRepeat() {
		return true
	}
	if resp := a.resp; resp != nil {
		return resp.StatusCode == http.StatusTooManyRequests || quotaRefusal(resp, a.now) || serverVouches(resp)
	}
	return !mayHaveSent(a.err, c.trace)
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

// MaxPeek is the most PeekBody reads.
const MaxPeek = 64 << 10

// PeekBody returns up to n bytes from the start of resp's body, for a
// WithRetryIf predicate that must read it (an error code in a JSON or XML
// body, a 403 that says "rate limit"), and puts them back: whoever reads the
// body next, the Transport or the caller, gets all of it. n is bounded by
// MaxPeek; fewer bytes come back when the body is shorter. An error other
// than the body's end is returned with what was read, and is returned again
// to the next reader after those bytes.
func PeekBody(resp *http.Response, n int) ([]byte, error) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody || n <= 0 {
		return nil, nil
	}
	buf := make([]byte, min(n, MaxPeek))
	got, err := io.ReadFull(resp.Body, buf)
	buf = buf[:got]
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	resp.Body = &peekedBody{prefix: *bytes.NewReader(buf), rest: resp.Body, err: err}
	return append([]byte(nil), buf...), err
}

// peekedBody is a body whose first bytes were read by PeekBody: it gives
// them again, then the rest.
type peekedBody struct {
	prefix bytes.Reader
	rest   io.ReadCloser
	err    error // the error the peek met, returned after the prefix
}

func (b *peekedBody) Read(p []byte) (int, error) {
	if b.prefix.Len() > 0 {
		return b.prefix.Read(p)
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.rest.Read(p)
}

func (b *peekedBody) Close() error { return b.rest.Close() }
