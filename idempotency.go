package retryhttp

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// The canonical names of the two idempotency headers that net/http itself
// honours when it replays a request on a fresh connection.
const (
	headerIdempotencyKey  = "Idempotency-Key"
	headerXIdempotencyKey = "X-Idempotency-Key"
)

// replayable reports whether req may be repeated after it may have reached
// the server: its method is idempotent by RFC 9110, or it carries a
// non-empty idempotency key.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace,
		http.MethodPut, http.MethodDelete:
		return true
	}
	return hasKey(req.Header)
}

// safeToRepeat reports whether the caller said the request is safe to
// repeat: its context's policy (PolicySafeToRepeat), or a predicate of the
// Transport's (WithSafeToRepeat). It is asked only after a failure, so the
// success path pays nothing for it.
func (c *call) safeToRepeat() bool {
	if p, ok := c.ctx.Value(policyKey{}).(*policy); ok && p.safeToRepeat {
		return true
	}
	for _, f := range c.t.safeToRepeat {
		if f(c.req) {
			return true
		}
	}
	return false
}

func hasKey(h http.Header) bool {
	return firstValue(h, headerIdempotencyKey) != "" || firstValue(h, headerXIdempotencyKey) != ""
}

// rewindable reports whether a retry can get a fresh copy of req's body.
func rewindable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// wantsAutoKey reports whether WithAutoIdempotencyKey applies to req.
func wantsAutoKey(req *http.Request) bool {
	return (req.Method == http.MethodPost || req.Method == http.MethodPatch) && !hasKey(req.Header)
}

// newIdempotencyKey returns a random UUID v4 (RFC 9562) from crypto/rand.
func newIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:]) // never returns an error (crypto/rand, Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// sendTrace watches, through net/http/httptrace, whether an attempt ever got
// a connection. If the base asked for one (GetConn) and never got it,
// nothing can have been written, so the server certainly did not act and any
// method may be sent again. Only requests that are not replayable carry it:
// the others pay nothing.
type sendTrace struct {
	getConn, gotConn atomic.Bool
	trace            httptrace.ClientTrace
}

func newSendTrace() *sendTrace {
	s := &sendTrace{}
	s.trace.GetConn = func(string) { s.getConn.Store(true) }
	s.trace.GotConn = func(httptrace.GotConnInfo) { s.gotConn.Store(true) }
	return s
}

// reset readies the trace for the next attempt.
func (s *sendTrace) reset() {
	s.getConn.Store(false)
	s.gotConn.Store(false)
}

// mayHaveSent reports whether an attempt that failed with err may have
// reached the server. A dial error never did, nor did one of net/http's
// HTTP/2 refusals of a stream it did not process; with a trace, neither did
// an attempt that got no connection. A base that gives no trace signal leaves
// only dial errors and those refusals as "not sent".
func mayHaveSent(err error, tr *sendTrace) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	if sent, ok := untypedNetHTTP(err); ok {
		return sent
	}
	if tr != nil && tr.getConn.Load() {
		return tr.gotConn.Load()
	}
	return true
}
