package retryhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// A retry sends the caller's body again, byte for byte. GetBody gives a
// fresh copy at no cost, and net/http sets it for the in-memory bodies of
// NewRequest. A body without it is an io.Seeker, rewound by seeking, or a
// plain reader (an SDK's own reader, a pipe), of which the Transport keeps
// a copy of what the base reads, up to the replay limit.
//
// The base owns the body of an attempt until it closes it, and may read it
// after RoundTrip returned (net/http's write loop does when a server
// answers before reading the whole body). So a replay, or a seek, waits for
// the base to close the attempt's body; only the caller's body underneath
// is closed, once, when the call is over and the last attempt's body has
// been closed.

// replayCloseWait bounds how long a retry waits for the base to close the
// previous attempt's body, beyond the retry's own wait. net/http closes it
// as soon as it stops writing, which a closed or drained response ends.
const replayCloseWait = time.Second

// errReplayClosed is what a read gets once the base closed its body.
var errReplayClosed = errors.New("retryhttp: read on a closed request body")

// replay holds a body without GetBody across the attempts of one call.
type replay struct {
	src    io.ReadCloser
	seeker io.Seeker // src, when it can seek: no copy is kept
	start  int64     // the offset of src when the call began, for seeking
	limit  int64

	mu      sync.Mutex
	buf     []byte // what the base read of src, when no seeker
	over    bool   // the base read more than limit: no replay
	srcErr  error  // src failed: no replay
	cur     *attemptBody
	reading bool   // a read of src is under way: a base that closed the body without waiting for it
	done    bool   // the call is over: src closes with cur
	closing func() // ends next's wait for cur to close
	closed  bool   // src is closed
}

// newReplay wraps req's body for replay, or returns nil when it needs no
// wrapper (GetBody, no body) or cannot have one (longer than limit).
func newReplay(req *http.Request, limit int64) *replay {
	body := req.Body
	if body == nil || body == http.NoBody || req.GetBody != nil {
		return nil
	}
	r := &replay{src: body, limit: limit}
	if s, ok := body.(io.Seeker); ok {
		if off, err := s.Seek(0, io.SeekCurrent); err == nil {
			r.seeker, r.start = s, off
			return r
		}
	}
	if limit < 0 || req.ContentLength > limit {
		return nil
	}
	return r
}

// first returns the body of the first attempt.
func (r *replay) first() io.ReadCloser {
	r.cur = &attemptBody{r: r, closed: make(chan struct{})}
	return r.cur
}

// possible reports whether a retry could still send the body again, as far
// as is known now; next has the last word.
func (r *replay) possible() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.over && r.srcErr == nil
}

// next returns the body of the next attempt, once the base has closed the
// previous one, or false when it cannot be had: the base read past the
// limit, the caller's body failed, or the base kept the body open.
func (r *replay) next(ctx context.Context, clk Clock) (io.ReadCloser, bool) {
	prev := r.cur
	if !prev.isClosed() {
		// The wait ends early when the base closes the body: its Close
		// cancels wctx.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		r.mu.Lock()
		r.closing = cancel
		closed := prev.isClosed()
		r.mu.Unlock()
		if !closed {
			clk.Sleep(wctx, replayCloseWait)
		}
		if !prev.isClosed() {
			return nil, false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over || r.srcErr != nil || r.closed || r.reading {
		return nil, false
	}
	if r.seeker != nil {
		if _, err := r.seeker.Seek(r.start, io.SeekStart); err != nil {
			r.srcErr = err
			return nil, false
		}
	}
	r.cur, r.closing = &attemptBody{r: r, closed: make(chan struct{})}, nil
	return r.cur, true
}

// finish says the call is over: the caller's body is closed now, or when
// the base closes the last attempt's body.
func (r *replay) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	select {
	case <-r.cur.closed:
		r.closeSrc()
	default:
	}
}

// closeSrc closes the caller's body once; r.mu is held.
func (r *replay) closeSrc() {
	if !r.closed {
		r.closed = true
		r.src.Close()
	}
}

// attemptBody is the body one attempt hands the base: the copy so far,
// then the rest of the caller's body, copied as it is read.
type attemptBody struct {
	r         *replay
	pos       int64 // bytes of the copy this attempt has read
	closed    chan struct{}
	closeOnce sync.Once
}

func (b *attemptBody) Read(p []byte) (int, error) {
	r := b.r
	r.mu.Lock()
	if b.isClosed() {
		r.mu.Unlock()
		return 0, errReplayClosed
	}
	if r.seeker == nil && b.pos < int64(len(r.buf)) {
		n := copy(p, r.buf[b.pos:])
		b.pos += int64(n)
		r.mu.Unlock()
		return n, nil
	}
	r.reading = true
	r.mu.Unlock()
	// The caller's body is read without the lock: a read may block, and
	// the base may close the attempt's body meanwhile to end it.
	n, err := r.src.Read(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reading = false
	if err != nil && err != io.EOF {
		r.srcErr = err
	}
	switch {
	case r.seeker != nil || r.over:
	case int64(len(r.buf)+n) > r.limit:
		r.over, r.buf = true, nil
	default:
		r.buf = append(r.buf, p[:n]...)
		b.pos += int64(n)
	}
	return n, err
}

func (b *attemptBody) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// Close ends the attempt's use of the body; the caller's body stays open
// for a retry, unless the call is over.
func (b *attemptBody) Close() error {
	b.closeOnce.Do(func() {
		r := b.r
		r.mu.Lock()
		close(b.closed)
		if r.closing != nil && r.cur == b {
			r.closing()
		}
		if r.done && r.cur == b {
			r.closeSrc()
		}
		r.mu.Unlock()
	})
	return nil
}
