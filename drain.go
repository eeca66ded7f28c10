package retryhttp

import (
	"bytes"
	"io"
	"net/http"
	"time"
)

// What becomes of a retried response's body: drained for its connection
// when the retry goes at once, held whole for the caller while the retry
// waits (it may yet be refused, and the caller then gets the response
// unread).

// drainLimit is how much of a retried response's body is read so that its
// connection can be reused; a longer body costs less to drop than to read.
const drainLimit = 64 << 10

// drainTime bounds how long a retried response's body is read, whatever
// the base: a connection is worth a few milliseconds, not the time a server
// takes to trickle a body nobody may read.
const drainTime = 50 * time.Millisecond

// held is a failed response waiting beside its retry. Until the retry is
// sent, the response may still be the caller's: if the retry cannot happen
// after all, the caller gets it whole, body unread.
type held struct {
	resp *http.Response
	body io.ReadCloser // the original body, still open, when it was too long to read
}

// hold readies a failed response to wait: a body of up to drainLimit is
// read into memory (for at most drainTime) and closed at once, so its
// connection goes back to the pool during the wait, and the response keeps
// a copy for the caller; a longer body stays unread until the retry is sent
// or the response handed back.
func hold(resp *http.Response) held {
	h := held{resp: resp}
	switch {
	case resp == nil || resp.Body == nil || resp.Body == http.NoBody:
		return h
	case resp.ContentLength == 0:
		resp.Body.Close() // nothing to read: its end frees the connection
		resp.Body = http.NoBody
		return h
	case resp.ContentLength > drainLimit:
		h.body = resp.Body
		return h
	}
	body := resp.Body
	// Closing the body from another goroutine ends a blocked read in
	// net/http's bodies, and in every wrapper that passes Close on.
	stop := time.AfterFunc(drainTime, func() { body.Close() })
	data, err := readBounded(body, resp.ContentLength)
	stop.Stop()
	if len(data) > drainLimit {
		h.body = body
		resp.Body = &peekedBody{prefix: *bytes.NewReader(data), rest: body}
		return h
	}
	body.Close()
	resp.Body = &peekedBody{prefix: *bytes.NewReader(data), rest: http.NoBody, err: err}
	return h
}

// readBounded reads a body of the given length, or, when it is unknown,
// up to one byte past drainLimit: that tells a body of exactly the limit,
// read to its EOF (which is what frees the connection), from a longer one.
func readBounded(body io.Reader, length int64) ([]byte, error) {
	if length > 0 {
		data := make([]byte, length)
		n, err := io.ReadFull(body, data)
		if err == nil {
			// Read to the EOF, which is what hands net/http's connection
			// back; a body longer than it said is not read further.
			var one [1]byte
			if _, err = body.Read(one[:]); err == io.EOF {
				err = nil
			}
		}
		return data[:n], err
	}
	return io.ReadAll(io.LimitReader(body, drainLimit+1))
}

// drain reads what is left of a retried response's body, up to drainLimit
// and for at most drainTime, and closes it, so that a keep-alive connection
// goes back to the pool; a longer body is closed unread.
func drain(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	if resp.ContentLength < 0 || resp.ContentLength <= drainLimit {
		body := resp.Body
		stop := time.AfterFunc(drainTime, func() { body.Close() })
		io.CopyN(io.Discard, body, drainLimit+1)
		stop.Stop()
	}
	resp.Body.Close()
}

// discard closes what is left of the response: the retry is on its way.
func (h held) discard() {
	if h.body != nil {
		h.body.Close()
	} else if h.resp != nil && h.resp.Body != nil {
		h.resp.Body.Close()
	}
}
