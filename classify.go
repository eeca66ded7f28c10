package retryhttp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"time"
)

// statusSet is a bitset of the statuses 0 to 639: a lookup on the success
// path is a shift and a mask.
type statusSet [10]uint64

func newStatusSet(codes []int) statusSet {
	var s statusSet
	for _, c := range codes {
		if c >= 100 && c <= 599 {
			s[c/64] |= 1 << (c % 64)
		}
	}
	return s
}

func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 640 && s[code/64]&(1<<(code%64)) != 0
}

// A response is worth another try when its status is in the Transport's set
// (WithRetryStatuses, WithExtraRetryStatuses), unless the server says
// otherwise. Two dialects of the services are read here:
//
//   - X-Should-Retry, which OpenAI's and Anthropic's APIs send, and their
//     SDKs obey over the status: "false" is final whatever the status or the
//     predicate; "true" makes a failure worth retrying, and, since the
//     server vouches that repeating it is harmless, safe to repeat
//     (repeatable).
//   - A 403 that refuses for a quota, as GitHub sends its rate limits: a wait
//     of a second or more, or a spent quota with its reset. It is a 429 in
//     another dialect, retried when 429 is, and, like a 429, proves the
//     server did not act. A 403 that names no such wait is final; so is a
//     403 with "Retry-After: 0", a template's zero on a rejection that is
//     permanent for the client.

// shouldRetryHeader reads X-Should-Retry: said is false when it is absent or
// neither "true" nor "false" (without case or surrounding white space).
func shouldRetryHeader(h http.Header) (retry, said bool) {
	switch v := strings.TrimSpace(firstValue(h, "X-Should-Retry")); {
	case strings.EqualFold(v, "true"):
		return true, true
	case strings.EqualFold(v, "false"):
		return false, true
	}
	return false, false
}

// serverSaysNo reports whether a response's X-Should-Retry forbids another
// try.
func serverSaysNo(resp *http.Response) bool {
	retry, said := shouldRetryHeader(resp.Header)
	return said && !retry
}

// serverVouches reports whether a failed response's X-Should-Retry asks for
// another try.
func serverVouches(resp *http.Response) bool {
	retry, _ := shouldRetryHeader(resp.Header)
	return retry && resp.StatusCode >= 400
}

// quotaRefusal reports whether a 403 refuses for a quota: it names a wait of
// a second or more, or says a quota is spent and when it resets.
func quotaRefusal(resp *http.Response, now time.Time) bool {
	if resp.StatusCode != http.StatusForbidden {
		return false
	}
	if w, ok := retryAfter(resp.Header, now); ok && w >= time.Second {
		return true
	}
	_, ok := quotaReset(resp.Header, now)
	return ok
}

// worthRetrying is the default classification of a response, under the
// status set s.
func worthRetrying(resp *http.Response, s *statusSet, now time.Time) bool {
	code := resp.StatusCode
	if code >= 400 {
		if retry, said := shouldRetryHeader(resp.Header); said {
			return retry
		}
	}
	if s.has(code) {
		return true
	}
	return s.has(http.StatusTooManyRequests) && quotaRefusal(resp, now)
}

// transientErrnos are the system errors of a network that may work on the
// next try: the peer refused or dropped the connection, or the path to it
// failed for a moment.
var transientErrnos = []syscall.Errno{
	syscall.ECONNREFUSED,
	syscall.ECONNRESET,
	syscall.ECONNABORTED,
	syscall.EPIPE,
	syscall.ETIMEDOUT,
	syscall.EHOSTUNREACH,
	syscall.ENETUNREACH,
	syscall.ENETDOWN,
	syscall.ENETRESET,
}

// transientError reports whether a transport error may go away by trying
// again. Only errors recognised by type are: a wrong certificate, a bad URL,
// an unsupported scheme, a name that does not resolve or a cancelled context
// fail the same way every time, and an error nobody recognises is not worth
// a retry either.
func transientError(ctx context.Context, err error) bool {
	// The caller's context ending is final. A timeout of the base's own
	// (awaiting headers, dialling, a TLS handshake) also matches
	// context.DeadlineExceeded in net/http, but while the caller's context
	// lives it is a timeout like any other, and may pass.
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return false
	}
	if certificateError(err) || malformedAddress(err) {
		return false
	}
	if timedOut(err) {
		return true // a slow attempt, abandoned: the next may be quick
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.IsTimeout || dns.IsTemporary
	}
	for _, errno := range transientErrnos {
		if errors.Is(err, errno) {
			return true
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true // dial, TLS handshake and response-header timeouts
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	if _, ok := untypedNetHTTP(err); ok {
		return true
	}
	return http2Transient(err)
}

// net/http returns some errors of a connection that may work on the next
// try as plain errors.New values, or formats their cause with %v: no type,
// no sentinel a caller can reach, so errors.Is and errors.As find nothing.
// They are recognised by their exact text, here and nowhere else, and each
// says whether the request can have reached the server. The texts are those
// of Go 1.26's net/http (transport.go and h2_bundle.go); a later release
// that rewords one makes that error unrecognised, which is the safe side: it
// is then not retried.
var untypedNetHTTPErrors = map[string]bool{ // text: the request may have reached the server
	// The keep-alive race: the server closed an idle connection just as
	// the request went out on it. net/http replays GET, HEAD, OPTIONS, TRACE
	// and keyed requests itself and returns this for the others (a PUT, a
	// DELETE, a POST); its comment says the request's body bytes may already
	// have been written, so a POST is not sent again.
	"http: server closed idle connection": true,
	// HTTP/2 connections that could not take the stream: nothing of the
	// request was processed (net/http's own http2canRetryError).
	"http2: client conn not usable":                               false,
	"http2: Transport received Server's graceful shutdown GOAWAY": false,
	"http2: client conn could not be established":                 false,
	// A connection that stopped answering pings, or closed while the body
	// was being sent: the stream may have been processed, like a reset.
	"http2: client connection lost": true,
	"http2: client conn is closed":  true,
}

// HTTP/2's refusal of a stream whose body it cannot send again: net/http
// gives up with this text around the cause, formatted with %v. It says it
// only for the errors it would retry itself (http2canRetryError: a refused
// stream, a connection unusable or going away before the stream was
// processed), so the server did not act on the request.
const (
	h2CannotRetryPrefix = "http2: Transport: cannot retry err ["
	h2CannotRetrySuffix = "] after Request.Body was written; define Request.GetBody to avoid this error"
)

// untypedNetHTTP reports whether err, or an error it wraps, is one of
// net/http's untyped transient errors, and whether the request may have
// reached the server.
func untypedNetHTTP(err error) (maySent, ok bool) {
	for _, e := range errorChain(err) {
		text := e.Error()
		if sent, found := untypedNetHTTPErrors[text]; found {
			return sent, true
		}
		if strings.HasPrefix(text, h2CannotRetryPrefix) && strings.HasSuffix(text, h2CannotRetrySuffix) {
			return false, true
		}
	}
	return false, false
}

// errorChain lists err and every error it wraps, depth first, through
// Unwrap() error and Unwrap() []error, up to a bound: a wrapper of a
// wrapper of net/http's error (a *url.Error, an instrumenting base) still
// shows it.
func errorChain(err error) []error {
	const maxChain = 16
	var out []error
	stack := []error{err}
	for len(stack) > 0 && len(out) < maxChain {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if e == nil {
			continue
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			stack = append(stack, u.Unwrap())
		case interface{ Unwrap() []error }:
			for i := len(u.Unwrap()) - 1; i >= 0; i-- {
				stack = append(stack, u.Unwrap()[i])
			}
		}
	}
	return out
}

// malformedAddress reports an address that can never be dialled: an
// invalid port, an unknown network, an address that does not parse. They
// come back as dial errors, which are otherwise worth another try.
func malformedAddress(err error) bool {
	var (
		addr    *net.AddrError
		invalid net.InvalidAddrError
		network net.UnknownNetworkError
		parse   *net.ParseError
	)
	return errors.As(err, &addr) || errors.As(err, &invalid) || errors.As(err, &network) || errors.As(err, &parse)
}

func certificateError(err error) bool {
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		herr  x509.HostnameError
		cerr  x509.CertificateInvalidError
		alert tls.AlertError
	)
	return errors.As(err, &verr) || errors.As(err, &uaerr) || errors.As(err, &herr) ||
		errors.As(err, &cerr) || errors.As(err, &alert)
}

// h2StreamError mirrors the fields of an HTTP/2 stream error. The HTTP/2
// code bundled in net/http lets errors.As fill any struct with these fields,
// and golang.org/x/net/http2.StreamError has them too.
type h2StreamError struct {
	StreamID uint32
	Code     uint32
	Cause    error
}

// HTTP/2 error codes (RFC 9113 §7) that say the server did not process the
// stream, or dropped it for reasons of its own that may pass.
const (
	h2InternalError = 0x2
	h2RefusedStream = 0x7
	h2Cancel        = 0x8 // only when sent by the peer; a local cancel shows as ctx.Err
	h2EnhanceCalm   = 0xb
)

// http2Transient recognises HTTP/2 refusals and GOAWAYs. net/http already
// retries the streams a GOAWAY proves unprocessed; what reaches us is a
// connection closed under a stream that may have been processed, which
// mayHaveSent and the idempotency rules then judge like a reset.
func http2Transient(err error) bool {
	var se h2StreamError
	if errors.As(err, &se) {
		switch se.Code {
		case h2RefusedStream, h2InternalError, h2EnhanceCalm, h2Cancel:
			return true
		}
		return false
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		name := reflect.TypeOf(e).Name()
		if name == "http2GoAwayError" || name == "GoAwayError" {
			return true
		}
	}
	return false
}

func (e h2StreamError) Error() string {
	return fmt.Sprintf("stream error %d on stream %d", e.Code, e.StreamID)
}
