package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
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
	// the first, which has not failed but not answered after Delay;
	// Status and Err are then zero.
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
// many tries were made over how long, and Unwraps to the last error, so
// errors.Is(err, syscall.ECONNREFUSED) and the like still work.
type RetryError struct {
	Method   string
	URL      string // without query or user info
	Attempts int
	Elapsed  time.Duration
	Err      error
}

// Error says what was sent, how many tries over how long, and the last
// error, without the query or user info of the URL.
func (e *RetryError) Error() string {
	tries := "attempts"
	if e.Attempts == 1 {
		tries = "attempt"
	}
	return fmt.Sprintf("%s %s: gave up after %d %s over %v: %s",
		e.Method, e.URL, e.Attempts, tries, e.Elapsed.Round(time.Millisecond), logError(e.Err))
}

// Unwrap returns the last try's error.
func (e *RetryError) Unwrap() error { return e.Err }

func (c *call) fail(n int, err error) error {
	return &RetryError{
		Method:   methodOf(c.req),
		URL:      redactedURL(c.req),
		Attempts: n,
		Elapsed:  c.t.clock.Now().Sub(c.start),
		Err:      err,
	}
}

// report calls the OnRetry hook (reason empty) or the OnGiveUp hook, and
// logs one line.
func (c *call) report(a *answer, delay time.Duration, reason Reason) {
	t := c.t
	status := 0
	if a.resp != nil {
		status = a.resp.StatusCode
	}
	hooks := t.onRetry
	if reason != "" {
		hooks = t.onGiveUp
	}
	if len(hooks) > 0 {
		ev := RetryEvent{Request: c.req, Attempt: a.n, Delay: delay, Status: status, Err: a.err, Key: c.key, Reason: reason}
		for _, hook := range hooks {
			hook(ev)
		}
	}
	if t.logger == nil {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String("method", methodOf(c.req)),
		slog.String("host", c.hostName()),
		slog.String("path", pathOf(c.req)),
		slog.Int("attempt", a.n))
	if status != 0 {
		attrs = append(attrs, slog.Int("status", status))
	}
	if a.err != nil {
		attrs = append(attrs, slog.String("error", logError(a.err)))
	}
	if reason == "" {
		attrs = append(attrs, slog.Duration("wait", delay))
		t.logger.LogAttrs(c.ctx, slog.LevelInfo, "retryhttp: retrying", attrs...)
		return
	}
	attrs = append(attrs, slog.String("reason", string(reason)))
	level := slog.LevelInfo
	if reason == ReasonBudget {
		level = slog.LevelWarn
	}
	t.logger.LogAttrs(c.ctx, level, "retryhttp: not retrying", attrs...)
}

// reportHedge tells the OnRetry hooks and the log of a hedge, sent beside
// the first attempt that has not answered after delay.
func (c *call) reportHedge(delay time.Duration) {
	t := c.t
	if len(t.onRetry) > 0 {
		ev := RetryEvent{Request: c.req, Attempt: 1, Delay: delay, Key: c.key, Hedge: true}
		for _, hook := range t.onRetry {
			hook(ev)
		}
	}
	if t.logger != nil {
		t.logger.LogAttrs(c.ctx, slog.LevelInfo, "retryhttp: hedging",
			slog.String("method", methodOf(c.req)), slog.String("host", c.hostName()),
			slog.String("path", pathOf(c.req)), slog.Duration("after", delay))
	}
}

// giveUp reports a failure handed back although it was worth a retry.
func (c *call) giveUp(a *answer, reason Reason) { c.report(a, 0, reason) }

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
	return req.URL.EscapedPath()
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
