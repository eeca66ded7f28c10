package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// A slow attempt is a failed attempt. WithAttemptTimeout bounds each
// attempt from the moment it is sent until its response headers arrive:
// the attempt gets a context of its own, cancelled at the timeout, so that
// the base abandons it (its connection closed, nothing left running). Once
// the headers are in, the timer is stopped and the body is the caller's:
// the attempt's context lives until the body is closed, and no timeout of
// ours cuts it.
//
// A timed-out attempt may have reached the server, so it is tried again
// only when the request is safe to repeat; the time it waited counts as
// its backoff (its retry goes at once, through the pace, the parking and
// the budget like any). The request's own context bounds everything.

// AttemptTimeoutError is the error of an attempt that got no response
// headers within the attempt timeout (WithAttemptTimeout,
// PolicyAttemptTimeout). errors.Is(err, context.DeadlineExceeded) reports
// true for it.
type AttemptTimeoutError struct {
	Attempt int           // the try that timed out, 1 for the first
	After   time.Duration // the attempt timeout
}

// Error says which attempt timed out, after how long.
func (e *AttemptTimeoutError) Error() string {
	return fmt.Sprintf("retryhttp: attempt %d timed out after %v awaiting response headers", e.Attempt, e.After)
}

// Is reports whether target is context.DeadlineExceeded.
func (e *AttemptTimeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// Timeout reports true: the error is a timeout, as net.Error's are.
func (e *AttemptTimeoutError) Timeout() bool { return true }

// errAttemptTimeout is the cause an attempt's context is cancelled with at
// its timeout.
var errAttemptTimeout = errors.New("retryhttp: attempt timeout")

// timedRoundTrip makes attempt n through the base under the attempt
// timeout d.
func (t *Transport) timedRoundTrip(req *http.Request, n int, d time.Duration) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(d, func() { cancel(errAttemptTimeout) })
	resp, err := t.roundTrip(req.WithContext(ctx))
	if !timer.Stop() || context.Cause(ctx) == errAttemptTimeout {
		// Timed out, or the headers came just as it did: the context is
		// gone, and the body with it.
		if resp != nil {
			resp.Body.Close()
		}
		cancel(nil)
		return nil, &AttemptTimeoutError{Attempt: n, After: d}
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = bodyWithCancel(resp.Body, func() { cancel(nil) })
	return resp, nil
}

// bodyWithCancel returns body with a Close that also ends the attempt's
// context. The body of a 101 Switching Protocols answer is also an
// io.Writer, and stays one.
func bodyWithCancel(body io.ReadCloser, cancel func()) io.ReadCloser {
	if rw, ok := body.(io.ReadWriteCloser); ok {
		return &cancelReadWriter{ReadWriteCloser: rw, cancel: cancel}
	}
	return &cancelReader{ReadCloser: body, cancel: cancel}
}

type cancelReader struct {
	io.ReadCloser
	cancel func()
}

func (b *cancelReader) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

type cancelReadWriter struct {
	io.ReadWriteCloser
	cancel func()
}

func (b *cancelReadWriter) Close() error {
	err := b.ReadWriteCloser.Close()
	b.cancel()
	return err
}

// timedOut reports whether err is an attempt's own timeout.
func timedOut(err error) bool {
	var te *AttemptTimeoutError
	return errors.As(err, &te)
}
