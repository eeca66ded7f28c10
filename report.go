package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// What the Transport says of what it did: the events for OnRetry, the log
// lines, and the error of a call that ended in one. Everything names a
// request by method, scheme, host and path only: queries carry tokens, user
// info carries passwords, and headers are never read here.

// RetryEvent describes a failed try that the classification says is worth
// retrying: OnRetry gets one just before each retry, OnGiveUp one when the
// failure is handed back instead, with Reason saying why.
type RetryEvent struct {
	Request *http.Request // the caller's request
	Attempt int           // the try that just failed, 1 for the first
	// Delay is how long the retry waited after the failure: backoff or
	// server-named wait, then the host's pace and parking. 0 when refused.
	Delay  time.Duration
	Status int   // the response's status; 0 when Err is set
	Err    error // the transport error; nil when Status is set
	// Key is the Idempotency-Key that WithAutoIdempotencyKey added to the
	// request, the same on every try; empty when it added none.
	Key string
	// Reason is empty for a retry; otherwise why the failure was handed
	// back as it is: one of the Reason constants.
	Reason Reason
	// Hedge is set for a hedge (WithHedging): one more attempt sent beside
	// the first, which has not failed but not answered after Delay, or
	// beside the first and a hedge, unanswered Delay after that hedge;
	// Attempt is then how many attempts are in flight before it (1 for
	// the first hedge), and Status and Err are zero. OnGiveUp gets one with Hedge set for a
	// hedge that was due after Delay and not sent, Reason saying why.
	Hedge bool
}

// ParkEvent describes a host parked by an answer; see WithOnPark.
type ParkEvent struct {
	Request *http.Request // the caller's request whose answer named the wait
	Host    string        // as the Transport names it: lower case, no default port
	Until   time.Time     // when the parking ends, bounded by MaxParking
	Status  int           // the status of the answer that named the wait
}

type resendKey struct{}

// ResendCount returns how many times a Transport of this package sent the
// request of ctx before this try: 0 for a first try, or for a context no
// Transport made, 1 for the first retry. It is for what runs below the
// Transport, in its base: OpenTelemetry's http.request.resend_count on the
// span of each try, a log line per try.
func ResendCount(ctx context.Context) int {
	n, _ := ctx.Value(resendKey{}).(int)
	return n
}

// RetryError is returned when the last try ended in an error. It says how
// many tries were made over how long, or, for a request tried once, why it
// was not tried again; it Unwraps to the last error, so
// errors.Is(err, syscall.ECONNREFUSED) and the like still work. Its text
// leaves out the method and URL, which net/http's *url.Error around it
// says already; they are in its fields.
type RetryError struct {
	Method   string
	URL      string // without query or user info
	Attempts int
	// Elapsed is the time from the first try's send to the end. A call
	// begun while the Transport held nothing for any host read no clock
	// before its first try (the success path's saving): its Elapsed runs
	// from that try's answer, or from the first record made meanwhile.
	Elapsed time.Duration
	// Reason is why the last failure was not retried, when it could have
	// been (a Reason constant); Final, when the error was of a kind no
	// retry cures ("certificate error"), or retries were off.
	Reason Reason
	Final  string
	Err    error
}

// Error says how many tries were made over how long, or why a request
// tried once was not tried again, and the last error, without the query or
// user info of the URL.
func (e *RetryError) Error() string {
	err := logError(e.Err)
	switch {
	case e.Attempts > 1:
		return fmt.Sprintf("retryhttp: gave up after %d attempts over %v: %s", e.Attempts, e.Elapsed.Round(time.Millisecond), err)
	case e.Reason != "" && e.Reason != ReasonAttempts:
		return fmt.Sprintf("retryhttp: not retried (%s): %s", e.Reason, err)
	case e.Final != "":
		return fmt.Sprintf("retryhttp: not retried (%s): %s", e.Final, err)
	}
	return "retryhttp: " + err
}

// Unwrap returns the last try's error.
func (e *RetryError) Unwrap() error { return e.Err }

// Timeout reports whether the last try's error was a timeout (an attempt
// timeout, a dial or header timeout of the base, a deadline): an
// http.Client's *url.Error asks its cause's Timeout, and stops at the
// first error that has one, so without it errors.As(err, &netErr) would
// find a RetryError that never times out.
func (e *RetryError) Timeout() bool {
	var te interface{ Timeout() bool }
	return errors.As(e.Err, &te) && te.Timeout()
}

// fail makes the error of a call whose try n ended in err, not retried for
// reason (empty: the error is not worth a retry, or retries are off).
func (c *call) fail(n int, err error, reason Reason) error {
	e := &RetryError{
		Method:   methodOf(c.req),
		URL:      redactedURL(c.req),
		Attempts: n,
		Elapsed:  c.t.clock.Now().Sub(c.start),
		Reason:   reason,
		Err:      err,
	}
	if reason == "" {
		e.Final = finalKind(c, err)
	}
	return e
}

// finalKind names why an error was not worth a retry, for RetryError.
func finalKind(c *call, err error) string {
	var dns *net.DNSError
	switch {
	case c.maxAttempts == 1:
		return "retries off"
	case c.ctx.Err() != nil:
		return "the request's context ended"
	case ownRefusal(err):
		return ""
	case certificateError(err):
		return "certificate error"
	case malformedAddress(err):
		return "malformed address"
	case errors.As(err, &dns) && dns.IsNotFound:
		return "the name does not resolve"
	case transientError(c.ctx, err):
		return ""
	}
	return "not an error a retry cures"
}

// notify calls the OnRetry hooks (reason empty) or the OnGiveUp hooks.
func (c *call) notify(a *answer, delay time.Duration, reason Reason) {
	t := c.t
	hooks := t.onRetry
	if reason != "" {
		hooks = t.onGiveUp
	}
	if len(hooks) == 0 {
		return
	}
	ev := RetryEvent{Request: c.req, Attempt: a.n, Delay: delay, Status: statusOf(a.resp), Err: a.err, Key: c.key, Reason: reason}
	for _, hook := range hooks {
		hook(ev)
	}
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// logRetry writes the line of a retry, as its wait starts: the attempt it
// is to be ("2 of 3"), what the last one got, and the wait planned, in
// seconds (the pace or a parking may add to it).
func (c *call) logRetry(a *answer, wait time.Duration) {
	if c.t.logger == nil {
		return
	}
	attrs := c.logAttrs(a, a.n+1)
	attrs = append(attrs, slog.Float64("wait", seconds(wait)))
	c.t.logger.LogAttrs(c.ctx, slog.LevelInfo, "retryhttp: retrying", attrs...)
}

// logGiveUp writes the line of a failure handed back although it was worth
// a retry, and why.
func (c *call) logGiveUp(a *answer, reason Reason) {
	if c.t.logger == nil {
		return
	}
	attrs := append(c.logAttrs(a, a.n), slog.String("reason", string(reason)))
	level := slog.LevelInfo
	if reason == ReasonBudget {
		level = slog.LevelWarn
	}
	c.t.logger.LogAttrs(c.ctx, level, "retryhttp: not retrying", attrs...)
}

// logAttrs are what every line says of a request and its last try: the
// request by method, host and path (never the query), the attempt as "n of
// max", and the status or error the last try got.
func (c *call) logAttrs(a *answer, attempt int) []slog.Attr {
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String("method", methodOf(c.req)),
		slog.String("host", c.hostName()),
		slog.String("path", pathOf(c.req)),
		slog.String("attempt", strconv.Itoa(attempt)+" of "+strconv.Itoa(c.maxAttempts)))
	if status := statusOf(a.resp); status != 0 {
		attrs = append(attrs, slog.Int("status", status))
	}
	if a.err != nil {
		attrs = append(attrs, slog.String("error", logError(a.err)))
	}
	return attrs
}

// seconds is a wait as log lines give it: seconds, to the millisecond.
func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// reportHedge tells the OnRetry hooks and the log of a hedge, sent beside
// the first attempt that has not answered after delay: just before it
// goes, on the hedge's goroutine.
func (t *Transport) reportHedge(ctx context.Context, req *http.Request, key, host string, attempt int, delay time.Duration) {
	if len(t.onRetry) > 0 {
		ev := RetryEvent{Request: req, Attempt: attempt, Delay: delay, Key: key, Hedge: true}
		for _, hook := range t.onRetry {
			hook(ev)
		}
	}
	if t.logger != nil {
		t.logger.LogAttrs(ctx, slog.LevelInfo, "retryhttp: hedging",
			slog.String("method", methodOf(req)), slog.String("host", host),
			slog.String("path", pathOf(req)), slog.Float64("after", seconds(delay)))
	}
}

// reportNoHedge tells the OnGiveUp hooks and the log of a hedge that was
// due after delay and not sent, for reason (the budget, the host's
// parking or pace, GetBody): every call slower than its hedge delay is
// hedged, or says why not.
func (t *Transport) reportNoHedge(ctx context.Context, req *http.Request, key, host string, attempt int, delay time.Duration, reason Reason) {
	if len(t.onGiveUp) > 0 {
		ev := RetryEvent{Request: req, Attempt: attempt, Delay: delay, Key: key, Reason: reason, Hedge: true}
		for _, hook := range t.onGiveUp {
			hook(ev)
		}
	}
	if t.logger != nil {
		level := slog.LevelInfo
		if reason == ReasonBudget {
			level = slog.LevelWarn
		}
		t.logger.LogAttrs(ctx, level, "retryhttp: not hedging",
			slog.String("method", methodOf(req)), slog.String("host", host),
			slog.String("path", pathOf(req)), slog.Float64("after", seconds(delay)),
			slog.String("reason", string(reason)))
	}
}

// giveUp reports a failure handed back although it was worth a retry.
func (c *call) giveUp(a *answer, reason Reason) {
	c.notify(a, 0, reason)
	c.logGiveUp(a, reason)
}

// Logs and errors name a request by method, scheme, host and path only:
// queries carry tokens, and user info carries passwords.

func methodOf(req *http.Request) string {
	if req.Method == "" {
		return http.MethodGet
	}
	return req.Method
}

func pathOf(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	if p := req.URL.EscapedPath(); p != "" {
		return p
	}
	return "/" // what net/http sends for an empty path
}

func redactedURL(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	u := url.URL{Scheme: req.URL.Scheme, Host: req.URL.Host, Path: req.URL.Path, RawPath: req.URL.RawPath}
	return u.String()
}

// logError is an error's text without the URL a *url.Error adds, which
// may carry a query or a password: such an error, outermost or wrapped,
// is shown as its operation and its own error only.
func logError(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err.Error()
	}
	inner := logError(ue.Err)
	if ue == err {
		return ue.Op + ": " + inner
	}
	// A wrapper around the *url.Error: keep its words, drop the URL.
	return strings.Replace(err.Error(), ue.Error(), ue.Op+": "+inner, 1)
}
