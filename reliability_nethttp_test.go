package retryhttp

// Errors net/http returns without a type or a sentinel: the keep-alive race
// and HTTP/2's refusal of a stream whose body it cannot send again. Each is
// provoked on a real net/http client, against a real net/http server or a
// raw HTTP/2 peer on loopback.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// closeWatchConn tells when net/http closes the connection it wraps.
type closeWatchConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeWatchConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestServerClosedIdleRetried provokes net/http's keep-alive race: the
// request takes an idle connection just as the server closes it. net/http
// replays a GET itself; a PUT or a DELETE comes back as "http: server
// closed idle connection", which the Transport retries, since the server
// never read it; an unkeyed POST, which net/http says may have written its
// body, is sent once.
func TestServerClosedIdleRetried(t *testing.T) {
	for _, tt := range []struct {
		method string
		tries  int // the client's tries
		execs  int // requests the server handled, the warm-up GET aside
	}{
		{http.MethodPut, 2, 1},
		{http.MethodDelete, 2, 1},
		{http.MethodPost, 1, 0},
	} {
		t.Run(tt.method, func(t *testing.T) {
			var execs atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.URL.Path == "/x" {
					execs.Add(1)
				}
				io.WriteString(w, "ok")
			}))
			defer srv.Close()
			var (
				mu    sync.Mutex
				conns []*closeWatchConn
			)
			var d net.Dialer
			base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				w := &closeWatchConn{Conn: c, closed: make(chan struct{})}
				mu.Lock()
				conns = append(conns, w)
				mu.Unlock()
				return w, nil
			}}
			defer base.CloseIdleConnections()
			tries := 0
			tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil),
				WithOnRetry(func(RetryEvent) { tries++ }))
			if status, _ := get(t, tr, srv.URL+"/warm"); status != http.StatusOK {
				t.Fatalf("warm-up: %d", status)
			}
			tries = 1
			// When the request has taken the idle connection, the server
			// closes it, and net/http sees the close before writing.
			var raced atomic.Bool
			trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused || raced.Swap(true) {
					return
				}
				srv.Config.SetKeepAlivesEnabled(false) // closes the idle connections
				mu.Lock()
				c := conns[0]
				mu.Unlock()
				select {
				case <-c.closed:
				case <-time.After(5 * time.Second):
					t.Error("the client never saw the server close its idle connection")
				}
			}}
			ctx := httptrace.WithClientTrace(context.Background(), trace)
			resp, err := sendCtx(ctx, tr, tt.method, srv.URL+"/x", "body", nil)
			if !raced.Load() {
				t.Fatal("the request did not reuse the idle connection")
			}
			switch {
			case tt.tries > 1 && err != nil:
				t.Fatalf("%s: %v", tt.method, err)
			case tt.tries > 1:
				readAll(resp)
			case err == nil:
				t.Fatalf("%s got %d, want net/http's error", tt.method, resp.StatusCode)
			case !strings.Contains(err.Error(), "server closed idle connection"):
				t.Fatalf("%s: %v, want the keep-alive race", tt.method, err)
			}
			if tries != tt.tries || int(execs.Load()) != tt.execs {
				t.Errorf("%s: %d tries, %d executions; want %d, %d (err %v)", tt.method, tries, execs.Load(), tt.tries, tt.execs, err)
			}
		})
	}
}

// TestHTTP2CannotRetryReplaysBody sends a body without GetBody to an HTTP/2
// peer that refuses the first stream (RST_STREAM REFUSED_STREAM): net/http
// cannot send such a body again and says so in an untyped error around the
// cause. A refused stream was never processed, so the Transport sends the
// body again from its copy, even for a POST without a key.
func TestHTTP2CannotRetryReplaysBody(t *testing.T) {
	for _, method := range []string{http.MethodPost, http.MethodPut} {
		t.Run(method, func(t *testing.T) {
			peer := startH2Refuser(t, 1)
			base := &http.Transport{Protocols: new(http.Protocols)}
			base.Protocols.SetUnencryptedHTTP2(true)
			defer base.CloseIdleConnections()
			tries := 1
			tr := New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil),
				WithOnRetry(func(RetryEvent) { tries++ }))
			payload := strings.Repeat("replayed body ", 1000)
			req, err := http.NewRequest(method, "http://"+peer.addr+"/upload", io.NopCloser(strings.NewReader(payload)))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", method, err)
			}
			if body := readAll(resp); resp.StatusCode != http.StatusOK || body != "ok" {
				t.Fatalf("%s: %d %q", method, resp.StatusCode, body)
			}
			refused, bodies := peer.result()
			if tries != 2 || refused != 1 || len(bodies) != 1 || bodies[0] != payload {
				t.Errorf("%s: %d tries, %d refused streams, %d bodies served (whole: %v); want 2, 1, 1, true",
					method, tries, refused, len(bodies), len(bodies) == 1 && bodies[0] == payload)
			}
		})
	}
}

// h2Refuser is a raw HTTP/2 peer (prior knowledge, no TLS) that refuses the
// first n streams it sees and answers 200 "ok" to the others once it has
// read their bodies.
type h2Refuser struct {
	addr    string
	mu      sync.Mutex
	refuse  int
	refused int
	bodies  []string
}

func (p *h2Refuser) result() (int, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused, append([]string(nil), p.bodies...)
}

func startH2Refuser(t *testing.T, n int) *h2Refuser {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &h2Refuser{addr: ln.Addr().String(), refuse: n}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				p.serve(c)
			}()
		}
	}()
	return p
}

// HTTP/2 frame types and flags (RFC 9113 §6) that the refuser uses.
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2Settings     = 0x4
	h2Ping         = 0x6
	h2FlagEnd      = 0x1 // END_STREAM; ACK on SETTINGS and PING
	h2FlagEndHeads = 0x4
)

func (p *h2Refuser) serve(c net.Conn) {
	r := bufio.NewReader(c)
	preface := make([]byte, len(http2Preface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2Preface {
		return
	}
	var wmu sync.Mutex
	write := func(typ, flags byte, stream uint32, payload []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		var hdr [9]byte
		hdr[0], hdr[1], hdr[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		hdr[3], hdr[4] = typ, flags
		binary.BigEndian.PutUint32(hdr[5:], stream)
		c.Write(append(hdr[:], payload...))
	}
	write(h2Settings, 0, 0, nil)
	bodies := map[uint32]*strings.Builder{}
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		length := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := hdr[3], hdr[4]
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		payload := make([]byte, length)
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		switch typ {
		case h2Settings:
			if flags&h2FlagEnd == 0 {
				write(h2Settings, h2FlagEnd, 0, nil)
			}
		case h2Ping:
			if flags&h2FlagEnd == 0 {
				write(h2Ping, h2FlagEnd, 0, payload)
			}
		case h2Headers:
			p.mu.Lock()
			refuse := p.refused < p.refuse
			if refuse {
				p.refused++
			}
			p.mu.Unlock()
			if refuse {
				write(h2RSTStream, 0, stream, []byte{0, 0, 0, 0x7}) // REFUSED_STREAM
				continue
			}
			bodies[stream] = &strings.Builder{}
			if flags&h2FlagEnd != 0 {
				p.answer(write, stream, bodies)
			}
		case h2Data:
			b, ok := bodies[stream]
			if !ok {
				continue // a refused stream's body, still on its way
			}
			b.Write(payload)
			if len(payload) > 0 { // give the flow-control window back
				inc := make([]byte, 4)
				binary.BigEndian.PutUint32(inc, uint32(len(payload)))
				write(0x8, 0, 0, inc)
				write(0x8, 0, stream, inc)
			}
			if flags&h2FlagEnd != 0 {
				p.answer(write, stream, bodies)
			}
		}
	}
}

const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

func (p *h2Refuser) answer(write func(byte, byte, uint32, []byte), stream uint32, bodies map[uint32]*strings.Builder) {
	p.mu.Lock()
	p.bodies = append(p.bodies, bodies[stream].String())
	p.mu.Unlock()
	delete(bodies, stream)
	write(h2Headers, h2FlagEndHeads, stream, []byte{0x88}) // HPACK: :status 200, static index 8
	write(h2Data, h2FlagEnd, stream, []byte("ok"))
}

// TestUntypedNetHTTPErrors is the table of net/http's untyped errors: which
// are transient, and which can have reached the server, wrapped or not.
func TestUntypedNetHTTPErrors(t *testing.T) {
	closedIdle := errors.New("http: server closed idle connection")
	cannotRetry := errors.New("http2: Transport: cannot retry err [stream error: stream ID 1; REFUSED_STREAM] after Request.Body was written; define Request.GetBody to avoid this error")
	for _, tt := range []struct {
		err              error
		transient, maybe bool
	}{
		{closedIdle, true, true},
		{&urlError{closedIdle}, true, true},
		{errors.Join(errors.New("other"), closedIdle), true, true},
		{cannotRetry, true, false},
		{errors.New("http2: client conn not usable"), true, false},
		{errors.New("http2: client connection lost"), true, true},
		{errors.New("http: server closed idle connection!"), false, true},
		{errors.New("http2: Transport: cannot retry err [x]"), false, true},
	} {
		if got := transientError(context.Background(), tt.err); got != tt.transient {
			t.Errorf("transientError(%q) = %v, want %v", tt.err, got, tt.transient)
		}
		if got := mayHaveSent(tt.err, nil); got != tt.maybe {
			t.Errorf("mayHaveSent(%q) = %v, want %v", tt.err, got, tt.maybe)
		}
	}
}

// urlError wraps an error as *url.Error does, without its text.
type urlError struct{ err error }

func (e *urlError) Error() string { return "Put \"http://x.test/\": " + e.err.Error() }
func (e *urlError) Unwrap() error { return e.err }
