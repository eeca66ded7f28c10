package retryhttp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"syscall"
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
	return http2Transient(err)
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
