package retryhttp

// Helpers of the reliability tests (reliability_*_test.go), some shared
// with soak_test.go, fuzz_test.go and transport_test.go: loopback servers
// with their connections tracked, raw TCP servers, fault injection
// (resets, cut-off bodies), goroutine leak checks, the fault table's
// requests and executions, and in-memory bases and bodies. The generic
// helpers (stub, get, send, countingBase, events, fixedRand) are in
// httptest_helpers_test.go.
//
// Every helper here is named rel* (but closedPort) so that it never
// collides with the helpers of the other test files of the package.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Goroutine and connection accounting.

// relGoroutines returns the stacks of all goroutines, by id.
func relGoroutines() map[int]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := make(map[int]string)
	for _, g := range strings.Split(string(buf), "\n\n") {
		var id int
		if _, err := fmt.Sscanf(g, "goroutine %d ", &id); err == nil {
			out[id] = g
		}
	}
	return out
}

// relNoLeaks fails t if, once t and its cleanups registered after this call
// are done, a goroutine started during t is still running. Call it first
// in a test, before the servers and transports whose cleanups it must
// outlive. Tests that use it must not run in parallel.
func relNoLeaks(t testing.TB) {
	t.Helper()
	before := relGoroutines()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			var left []string
			for id, g := range relGoroutines() {
				if _, ok := before[id]; !ok {
					left = append(left, g)
				}
			}
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				sort.Strings(left)
				t.Errorf("%d goroutine(s) left behind:\n%s", len(left), strings.Join(left, "\n\n"))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// relConns tracks a server's connections through http.Server.ConnState.
type relConns struct {
	mu    sync.Mutex
	state map[net.Conn]http.ConnState
	total int
}

func (c *relConns) hook(conn net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == nil {
		c.state = make(map[net.Conn]http.ConnState)
	}
	if s == http.StateNew {
		c.total++
	}
	c.state[conn] = s
}

// open lists the connections that are neither closed nor hijacked (the
// handlers here close what they hijack).
func (c *relConns) open() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for conn, s := range c.state {
		if s != http.StateClosed && s != http.StateHijacked {
			out = append(out, conn.RemoteAddr().String()+" "+s.String())
		}
	}
	return out
}

func (c *relConns) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// relWaitClosed fails t unless every connection the server saw is closed
// within a bound, once the client has closed its idle connections: a
// connection still active then is one the client leaked (a body never
// closed), one still idle is one CloseIdleConnections did not reach.
func relWaitClosed(t testing.TB, c *relConns, closeIdle func()) {
	t.Helper()
	closeIdle()
	deadline := time.Now().Add(3 * time.Second)
	for {
		open := c.open()
		if len(open) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("server connections still open after the client closed its idle ones: %v", open)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// relServer is an httptest server with its connections tracked.
type relServer struct {
	*httptest.Server
	conns relConns
	stop  chan struct{} // closed before the server, to release hung handlers
}

type relServerOpts struct {
	h2 bool // HTTP/2 over TLS
	// connContext, when set, is the server's ConnContext.
	connContext func(context.Context, net.Conn) context.Context
}

// relStart starts a loopback server. Its cleanup releases the handlers
// that wait on stop, then closes the server.
func relStart(t testing.TB, h http.Handler, o relServerOpts) *relServer {
	t.Helper()
	s := &relServer{stop: make(chan struct{})}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = s.conns.hook
	s.Config.ConnContext = o.connContext
	s.Config.ErrorLog = relQuietLog()
	if o.h2 {
		s.EnableHTTP2 = true
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(func() {
		close(s.stop)
		s.Close()
	})
	return s
}

// relReset closes conn with SO_LINGER 0, so the peer gets a RST rather
// than a FIN.
func relReset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

// relHijackReset takes the connection of w and resets it.
func relHijackReset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	relReset(conn)
}

// relRawServer is a TCP listener whose connections are given to fn and
// closed after it; it speaks no HTTP of its own.
type relRawServer struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func relStartRaw(t testing.TB, fn func(net.Conn)) *relRawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &relRawServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer conn.Close()
				fn(conn)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *relRawServer) URL() string { return "http://" + s.ln.Addr().String() }

// closedPort returns a loopback address (host:port) nothing listens on: a
// request to it is refused before anything is sent. It is shared with
// transport_test.go.
func closedPort(t testing.TB) string {
	t.Helper()
	if addr, ok := boundPort(t); ok {
		return addr
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// relQuietLog is a server error log that drops what the faults make the
// servers say (TLS handshake errors, aborted handlers).
func relQuietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// ---------------------------------------------------------------------------
// Fault injection.

// relResetMidBody answers status with a body promised at length bytes,
// sends the first 1000, then resets the connection, after acting on the
// request.
func relResetMidBody(status, length int) func(*relExec, *relServer) http.HandlerFunc {
	return func(ex *relExec, _ *relServer) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ex.act(r)
			w.Header().Set("Content-Length", strconv.Itoa(length))
			w.WriteHeader(status)
			w.Write(bytes.Repeat([]byte("x"), 1000))
			http.NewResponseController(w).Flush()
			relHijackReset(w)
		}
	}
}

// relHalfChunked answers with statusLine and a chunked body cut off in the
// middle of its first chunk, after acting on the request.
func relHalfChunked(statusLine string) func(*relExec, *relServer) http.HandlerFunc {
	return func(ex *relExec, _ *relServer) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ex.act(r)
			conn, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			defer conn.Close()
			bw.WriteString("HTTP/1.1 " + statusLine + "\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n")
			bw.WriteString(strings.Repeat("y", 100))
			bw.Flush()
		}
	}
}

// ---------------------------------------------------------------------------
// Fault injection: for each fault, how many times the server acted on an
// idempotent request (GET, PUT), a keyed POST and an unkeyed POST.

// relMethod is one kind of request the fault table sends.
type relMethod struct {
	name   string
	method string
	key    string
	body   string
}

var relMethods = []relMethod{
	{name: "GET", method: http.MethodGet},
	{name: "PUT", method: http.MethodPut, body: "put-body-0123456789"},
	{name: "POST+key", method: http.MethodPost, key: "k-1", body: "keyed-post-body"},
	{name: "POST", method: http.MethodPost, body: "unkeyed-post-body"},
}

func (m relMethod) request(t testing.TB, url string) *http.Request {
	t.Helper()
	var body io.Reader
	if m.body != "" {
		body = strings.NewReader(m.body)
	}
	req, err := http.NewRequest(m.method, url+"/fault?x=1", body)
	if err != nil {
		t.Fatal(err)
	}
	if m.key != "" {
		req.Header.Set("Idempotency-Key", m.key)
	}
	return req
}

// relCounts is what a fault should come to for each relMethod, in order:
// GET, PUT, keyed POST, unkeyed POST.
type relCounts [4]int

// relExec is a handler prologue: it reads the body, checks it is the one
// sent, and counts one execution.
type relExec struct {
	n        atomic.Int64
	badBody  atomic.Int64
	wantBody string
}

func (e *relExec) act(r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil || string(b) != e.wantBody {
		e.badBody.Add(1)
		return
	}
	e.n.Add(1)
}

// relOutcome is what the client saw.
type relOutcome struct {
	status   int          // final status, 0 for an error
	attempts int          // tries made, from the OnRetry events
	bodyErr  bool         // reading the final body failed
	err      error        // the error returned, if any
	reasons  string       // reasons of refused retries
	events   []RetryEvent // all of them
}

// relDo sends req through a Transport on base with short waits and no
// budget (extra options may change that), reads and closes the final body,
// and says what happened.
func relDo(t testing.TB, base http.RoundTripper, req *http.Request, extra ...Option) relOutcome {
	t.Helper()
	var mu sync.Mutex
	var out relOutcome
	out.attempts = 1
	opts := append([]Option{
		WithBase(base),
		WithBackoff(time.Millisecond, 5*time.Millisecond),
		WithRetryAfterLimits(time.Millisecond, 50*time.Millisecond),
		WithBudget(nil),
	}, extra...)
	opts = append(opts, onEvents(func(ev RetryEvent) {
		mu.Lock()
		defer mu.Unlock()
		out.events = append(out.events, ev)
		if ev.Reason == "" {
			out.attempts++
		} else {
			out.reasons += string(ev.Reason) + ";"
		}
	}))
	tr := New(opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := tr.RoundTrip(req.WithContext(ctx))
	out.err = err
	if resp != nil {
		out.status = resp.StatusCode
		_, rerr := io.Copy(io.Discard, resp.Body)
		out.bodyErr = rerr != nil
		resp.Body.Close()
	}
	if err != nil {
		var re *RetryError
		if !errors.As(err, &re) {
			t.Errorf("error is not a *RetryError: %T %v", err, err)
		} else if re.Attempts != out.attempts {
			t.Errorf("RetryError says %d attempts, the events %d", re.Attempts, out.attempts)
		}
	}
	return out
}

// relH1Base is a fresh HTTP/1 base, so that no connection is shared
// between subtests.
func relH1Base() *http.Transport {
	return &http.Transport{
		DisableCompression:  true,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     5 * time.Second,
	}
}

// ---------------------------------------------------------------------------
// In-memory bases.

// relRoundTripFunc is an in-memory base.
type relRoundTripFunc func(*http.Request) (*http.Response, error)

func (f relRoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// relBody is a response body that counts what was read of it and whether
// it was closed. Its content is n bytes of 'z'; n < 0 means endless.
type relBody struct {
	left   int64
	read   atomic.Int64
	closed atomic.Bool
}

func relNewBody(n int64) *relBody { return &relBody{left: n} }

func (b *relBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errors.New("read after close")
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	if b.left > 0 && int64(len(p)) > b.left {
		p = p[:b.left]
	}
	for i := range p {
		p[i] = 'z'
	}
	if b.left > 0 {
		b.left -= int64(len(p))
	}
	b.read.Add(int64(len(p)))
	return len(p), nil
}

func (b *relBody) Close() error { b.closed.Store(true); return nil }

// relResponse makes a response for an in-memory base.
func relResponse(req *http.Request, status int, h http.Header, body *relBody, length int64) *http.Response {
	if h == nil {
		h = make(http.Header)
	}
	var rc io.ReadCloser = http.NoBody
	if body != nil {
		rc = body
	}
	return &http.Response{
		Status:        http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          rc,
		ContentLength: length,
		Request:       req,
	}
}

func relGet(t testing.TB, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
