package retryhttp

// Reliability: faults injected on real loopback servers, cancels and
// deadlines, hostile headers and bodies, and what the Transport lets out
// (logs, events, errors, idempotency keys). Issue 4.
//
// Every helper here is named rel* so that it never collides with the
// helpers of the other test files of the package.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

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

// relRefusedURL returns the URL of a loopback port nobody listens on.
func relRefusedURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// relQuietLog is a server error log that drops what the faults make the
// servers say (TLS handshake errors, aborted handlers).
func relQuietLog() *log.Logger { return log.New(io.Discard, "", 0) }

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
	opts = append(opts, WithOnRetry(func(ev RetryEvent) {
		mu.Lock()
		defer mu.Unlock()
		out.events = append(out.events, ev)
		if ev.Reason == "" {
			out.attempts++
		} else {
			out.reasons += ev.Reason + ";"
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

// relTarget is a faulty server and the base to reach it.
type relTarget struct {
	url      string
	base     *http.Transport
	ex       *relExec   // the handler's executions; nil when no handler runs
	conns    *relConns  // the server's connections; nil when it has none to track
	accepted func() int // connections a raw listener accepted; nil for the others
}

// TestReliabilityFaults injects each fault against a loopback server and
// sends a GET, a PUT, a keyed POST and an unkeyed POST into it: the server
// acts on each as many times as the rules allow and no more (an unkeyed
// POST never twice, and retried only when it never left the client), the
// client ends as it should, no goroutine is left behind and every server
// connection is closed once the client closes its idle ones.
func TestReliabilityFaults(t *testing.T) {
	type fault struct {
		name string
		// start starts the faulty server for a request of m.
		start func(t *testing.T, m relMethod) relTarget
		execs relCounts // server-side executions
		tries relCounts // attempts the client made
		// status is the final status, or 0 for an error
		status  int
		bodyErr bool // reading the final body fails
		errIs   error
	}
	httpServer := func(h func(*relExec, *relServer) http.HandlerFunc, o relServerOpts) func(*testing.T, relMethod) relTarget {
		return func(t *testing.T, m relMethod) relTarget {
			ex := &relExec{wantBody: m.body}
			var srv *relServer
			srv = relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h(ex, srv)(w, r)
			}), o)
			base := relH1Base()
			if o.h2 {
				base = srv.Client().Transport.(*http.Transport).Clone()
			}
			return relTarget{url: srv.URL, base: base, ex: ex, conns: &srv.conns}
		}
	}
	faults := []fault{
		{
			name: "connection refused",
			start: func(t *testing.T, m relMethod) relTarget {
				return relTarget{url: relRefusedURL(t), base: relH1Base()}
			},
			execs: relCounts{0, 0, 0, 0},
			tries: relCounts{3, 3, 3, 3}, // never sent: any method may be tried again
			errIs: syscall.ECONNREFUSED,
		},
		{
			name: "reset before the request is read",
			start: func(t *testing.T, m relMethod) relTarget {
				raw := relStartRaw(t, func(c net.Conn) {
					// Wait for the first byte of the request, so that the
					// client has its connection and has written, then reset
					// with the rest unread. (Resetting at once races the
					// client's connect, which may then fail as a dial error:
					// a request never sent, which any method may retry.)
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					c.Read(make([]byte, 1))
					relReset(c)
				})
				return relTarget{url: raw.URL(), base: relH1Base(), accepted: func() int { return int(raw.accepted.Load()) }}
			},
			execs: relCounts{0, 0, 0, 0},
			tries: relCounts{3, 3, 3, 1}, // the client cannot know it was not read
		},
		{
			name: "reset after the request is acted on",
			start: httpServer(func(ex *relExec, _ *relServer) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					ex.act(r)
					relHijackReset(w)
				}
			}, relServerOpts{}),
			execs: relCounts{3, 3, 3, 1},
			tries: relCounts{3, 3, 3, 1},
			errIs: syscall.ECONNRESET,
		},
		{
			name:    "reset mid-response body",
			start:   httpServer(relResetMidBody(http.StatusOK, 100000), relServerOpts{}),
			execs:   relCounts{1, 1, 1, 1}, // a 200 is the answer, whatever its body does later
			tries:   relCounts{1, 1, 1, 1},
			status:  http.StatusOK,
			bodyErr: true,
		},
		{
			name:    "reset mid-body of a 503",
			start:   httpServer(relResetMidBody(http.StatusServiceUnavailable, 10000), relServerOpts{}),
			execs:   relCounts{3, 3, 3, 1},
			tries:   relCounts{3, 3, 3, 1},
			status:  http.StatusServiceUnavailable,
			bodyErr: true,
		},
		{
			name: "server never answers",
			start: func(t *testing.T, m relMethod) relTarget {
				tg := httpServer(func(ex *relExec, srv *relServer) http.HandlerFunc {
					return func(w http.ResponseWriter, r *http.Request) {
						ex.act(r)
						select {
						case <-r.Context().Done():
						case <-srv.stop:
						}
					}
				}, relServerOpts{})(t, m)
				tg.base.ResponseHeaderTimeout = 100 * time.Millisecond
				return tg
			},
			execs: relCounts{3, 3, 3, 1},
			tries: relCounts{3, 3, 3, 1},
		},
		{
			name:    "half-written chunked body",
			start:   httpServer(relHalfChunked("200 OK"), relServerOpts{}),
			execs:   relCounts{1, 1, 1, 1},
			tries:   relCounts{1, 1, 1, 1},
			status:  http.StatusOK,
			bodyErr: true,
		},
		{
			name:    "half-written chunked body of a 502",
			start:   httpServer(relHalfChunked("502 Bad Gateway"), relServerOpts{}),
			execs:   relCounts{3, 3, 3, 1},
			tries:   relCounts{3, 3, 3, 1},
			status:  http.StatusBadGateway,
			bodyErr: true,
		},
		{
			name: "HTTP/2 stream reset by the server",
			start: httpServer(func(ex *relExec, _ *relServer) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					if r.ProtoMajor != 2 {
						panic("not HTTP/2")
					}
					ex.act(r)
					panic(http.ErrAbortHandler) // RST_STREAM INTERNAL_ERROR
				}
			}, relServerOpts{h2: true}),
			execs: relCounts{3, 3, 3, 1},
			tries: relCounts{3, 3, 3, 1},
		},
		{
			name: "HTTP/2 connection reset mid-request",
			start: httpServer(func(ex *relExec, _ *relServer) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					if r.ProtoMajor != 2 {
						panic("not HTTP/2")
					}
					ex.act(r)
					relReset(r.Context().Value(relConnKey{}).(net.Conn))
					<-r.Context().Done()
				}
			}, relServerOpts{h2: true, connContext: relStashConn}),
			execs: relCounts{3, 3, 3, 1},
			tries: relCounts{3, 3, 3, 1},
		},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			for i, m := range relMethods {
				t.Run(m.name, func(t *testing.T) {
					relNoLeaks(t)
					tg := f.start(t, m)
					ex := tg.ex
					out := relDo(t, tg.base, m.request(t, tg.url))
					t.Logf("tries %d, status %d, body error %v, err %v, refused: %s", out.attempts, out.status, out.bodyErr, out.err, out.reasons)
					if ex != nil {
						if got := int(ex.n.Load()); got != f.execs[i] {
							t.Errorf("server acted %d times, want %d", got, f.execs[i])
						}
						if n := ex.badBody.Load(); n != 0 {
							t.Errorf("%d attempts reached the server with a body not the one sent", n)
						}
					}
					if out.attempts != f.tries[i] {
						t.Errorf("client made %d tries, want %d", out.attempts, f.tries[i])
					}
					if tg.accepted != nil && tg.accepted() != f.tries[i] {
						t.Errorf("server accepted %d connections for %d tries", tg.accepted(), f.tries[i])
					}
					if out.status != f.status {
						t.Errorf("final status %d, want %d (err %v)", out.status, f.status, out.err)
					}
					if (out.err != nil) != (f.status == 0) {
						t.Errorf("error %v with status %d", out.err, out.status)
					}
					if f.errIs != nil && !errors.Is(out.err, f.errIs) {
						t.Errorf("error %v is not %v", out.err, f.errIs)
					}
					if out.bodyErr != f.bodyErr {
						t.Errorf("body read error %v, want %v", out.bodyErr, f.bodyErr)
					}
					if m.key == "" && m.method == http.MethodPost {
						if ex != nil && ex.n.Load() > 1 {
							t.Errorf("a POST without a key was executed %d times", ex.n.Load())
						}
						// R3: it is tried again only when the last try never
						// left the client.
						for _, ev := range out.events {
							if ev.Reason == "" && mayHaveSent(ev.Err, nil) {
								t.Errorf("a POST without a key was retried after %v, which may have reached the server", ev.Err)
							}
						}
					}
					if tg.conns != nil {
						relWaitClosed(t, tg.conns, tg.base.CloseIdleConnections)
					}
					tg.base.CloseIdleConnections()
				})
			}
		})
	}
}

type relConnKey struct{}

func relStashConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, relConnKey{}, c)
}

// TestReliabilityHTTP2GoAway sends a request to an HTTP/2 server that is
// shut down while the request is in its handler: the server says GOAWAY,
// and then either lets the handler finish (graceful) or closes the
// connection under it (forced). The Transport's base dials the first
// server once and a second, healthy one after that, so a retry has
// somewhere to go. Graceful: the request is answered once, nothing is
// repeated. Forced: the client gets net/http's GOAWAY error; GET, PUT and a
// keyed POST are retried on the second server, an unkeyed POST is not.
func TestReliabilityHTTP2GoAway(t *testing.T) {
	for _, forced := range []bool{false, true} {
		mode := "graceful"
		if forced {
			mode = "forced"
		}
		t.Run(mode, func(t *testing.T) {
			for _, m := range relMethods {
				t.Run(m.name, func(t *testing.T) {
					relNoLeaks(t)
					exA, exB := &relExec{wantBody: m.body}, &relExec{wantBody: m.body}
					inHandler, release := make(chan struct{}, 1), make(chan struct{})
					a := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						exA.act(r)
						inHandler <- struct{}{}
						select {
						case <-release:
							w.Write([]byte("from A"))
						case <-r.Context().Done():
						}
					}), relServerOpts{h2: true})
					b := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						exB.act(r)
						w.Write([]byte("from B"))
					}), relServerOpts{h2: true})
					base := a.Client().Transport.(*http.Transport).Clone()
					var dials atomic.Int64
					var d net.Dialer
					base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
						addr := b.Listener.Addr().String()
						if dials.Add(1) == 1 {
							addr = a.Listener.Addr().String()
						}
						return d.DialContext(ctx, network, addr)
					}
					var (
						mu     sync.Mutex
						events []RetryEvent
					)
					tr := New(WithBase(base), WithBudget(nil),
						WithBackoff(time.Millisecond, 5*time.Millisecond),
						WithOnRetry(func(ev RetryEvent) { mu.Lock(); events = append(events, ev); mu.Unlock() }))

					type result struct {
						status int
						body   string
						err    error
					}
					done := make(chan result, 1)
					go func() {
						resp, err := tr.RoundTrip(m.request(t, a.URL))
						if err != nil {
							done <- result{err: err}
							return
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						done <- result{status: resp.StatusCode, body: string(body)}
					}()
					select {
					case <-inHandler:
					case <-time.After(5 * time.Second):
						t.Fatal("the request never reached the first server")
					}
					ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
					if forced {
						// GOAWAY goes out; the stream stays open until the
						// shutdown gives up waiting, then the connection is cut.
						a.Config.Shutdown(ctx)
						a.CloseClientConnections()
					} else {
						go func() {
							time.Sleep(100 * time.Millisecond) // let the GOAWAY go out first
							close(release)
						}()
						if err := a.Config.Shutdown(context.Background()); err != nil {
							t.Errorf("graceful shutdown: %v", err)
						}
					}
					cancel()
					var res result
					select {
					case res = <-done:
					case <-time.After(5 * time.Second):
						t.Fatal("the request did not end")
					}
					mu.Lock()
					var errs []string
					for _, ev := range events {
						errs = append(errs, fmt.Sprintf("attempt %d: %v (%s)", ev.Attempt, ev.Err, ev.Reason))
					}
					mu.Unlock()
					t.Logf("status %d, body %q, err %v; events %q", res.status, res.body, res.err, errs)

					if n := exA.n.Load() + exA.badBody.Load(); n != 1 {
						t.Errorf("first server got the request %d times, want 1", n)
					}
					if exA.badBody.Load()+exB.badBody.Load() != 0 {
						t.Error("a body reached a server altered")
					}
					wantB, wantStatus, wantBody := int64(0), http.StatusOK, "from A"
					if forced {
						wantBody = "from B"
						wantB = 1
						if m.method == http.MethodPost && m.key == "" {
							wantB, wantStatus, wantBody = 0, 0, ""
						}
					}
					if got := exB.n.Load(); got != wantB {
						t.Errorf("second server acted %d times, want %d", got, wantB)
					}
					if res.status != wantStatus || res.body != wantBody {
						t.Errorf("got status %d body %q (err %v), want %d %q", res.status, res.body, res.err, wantStatus, wantBody)
					}
					if forced {
						mu.Lock()
						if len(events) != 1 || !relIsGoAway(events[0].Err) {
							t.Errorf("want one event for a GOAWAY error, got %q", errs)
						} else if wantB == 0 && events[0].Reason != reasonIdempotent {
							t.Errorf("unkeyed POST after GOAWAY: reason %q, want %q", events[0].Reason, reasonIdempotent)
						}
						mu.Unlock()
						if wantStatus == 0 && !relIsGoAway(res.err) {
							t.Errorf("error %v is not net/http's GOAWAY error", res.err)
						}
					}
					if !forced {
						// The client honoured the GOAWAY: the next request
						// opens a connection to the second server.
						resp, err := tr.RoundTrip(m.request(t, a.URL))
						if err != nil {
							t.Fatalf("request after the GOAWAY: %v", err)
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if string(body) != "from B" || exB.n.Load() != 1 || exA.n.Load() != 1 {
							t.Errorf("after the GOAWAY: body %q, executions %d and %d, want %q, 1 and 1",
								body, exA.n.Load(), exB.n.Load(), "from B")
						}
					}
					relWaitClosed(t, &b.conns, base.CloseIdleConnections)
					relWaitClosed(t, &a.conns, base.CloseIdleConnections)
				})
			}
		})
	}
}

// relIsGoAway reports whether err wraps net/http's HTTP/2 GOAWAY error.
func relIsGoAway(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.Contains(reflect.TypeOf(e).Name(), "GoAway") {
			return true
		}
	}
	return false
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

// ---------------------------------------------------------------------------
// Connections and bodies: a retried response is drained and its connection
// reused; a large one is dropped without being read.

func TestReliabilityRetriedResponseConnections(t *testing.T) {
	cases := []struct {
		name      string
		body      int  // bytes of each 503's body
		chunked   bool // send it without a Content-Length
		wantConns int  // server connections for the three tries
	}{
		{name: "small body reuses the connection", body: 512, wantConns: 1},
		{name: "small chunked body reuses the connection", body: 512, chunked: true, wantConns: 1},
		{name: "64 KiB body reuses the connection", body: 64 << 10, wantConns: 1},
		{name: "64 KiB chunked body reuses the connection", body: 64 << 10, chunked: true, wantConns: 1},
		{name: "large body is dropped with its connection", body: 256 << 10, wantConns: 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			relNoLeaks(t)
			var n atomic.Int64
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 3 {
					w.Write([]byte("ok"))
					return
				}
				if !c.chunked {
					w.Header().Set("Content-Length", fmt.Sprint(c.body))
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write(bytes.Repeat([]byte("e"), c.body))
			}), relServerOpts{})
			base := relH1Base()
			out := relDo(t, base, relMethods[0].request(t, srv.URL))
			if out.status != http.StatusOK || out.attempts != 3 {
				t.Fatalf("status %d after %d tries, want 200 after 3", out.status, out.attempts)
			}
			if got := srv.conns.count(); got != c.wantConns {
				t.Errorf("server saw %d connections, want %d", got, c.wantConns)
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
	}
}

// TestReliabilityHugeBodyNotRead retries a response whose body is 100 MiB:
// the Transport reads at most 64 KiB of it, whether the server sends it on
// a real connection or an in-memory base hands it over.
func TestReliabilityHugeBodyNotRead(t *testing.T) {
	const huge = 100 << 20
	for _, chunked := range []bool{false, true} {
		name := "content-length"
		if chunked {
			name = "chunked"
		}
		t.Run("loopback/"+name, func(t *testing.T) {
			relNoLeaks(t)
			var (
				n       atomic.Int64
				written atomic.Int64
				done    = make(chan struct{})
			)
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) > 1 {
					w.Write([]byte("ok"))
					return
				}
				defer close(done)
				if !chunked {
					w.Header().Set("Content-Length", fmt.Sprint(huge))
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				chunk := bytes.Repeat([]byte("h"), 32<<10)
				for written.Load() < huge {
					k, err := w.Write(chunk)
					written.Add(int64(k))
					if err != nil {
						return
					}
				}
			}), relServerOpts{})
			base := relH1Base()
			start := time.Now()
			out := relDo(t, base, relMethods[0].request(t, srv.URL))
			if out.status != http.StatusOK || out.attempts != 2 {
				t.Fatalf("status %d after %d tries, want 200 after 2", out.status, out.attempts)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the server is still writing the huge body")
			}
			t.Logf("server wrote %d of %d bytes before the client hung up; %v", written.Load(), huge, time.Since(start))
			if written.Load() >= huge/4 {
				t.Errorf("server wrote %d bytes: the retried body was read", written.Load())
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
		t.Run("in-memory/"+name, func(t *testing.T) {
			var bodies []*relBody
			base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
				b := relNewBody(huge)
				bodies = append(bodies, b)
				length := int64(huge)
				if chunked {
					length = -1
				}
				return relResponse(r, http.StatusServiceUnavailable, nil, b, length), nil
			})
			tr := New(WithBase(base), WithBudget(nil), WithBackoff(time.Microsecond, time.Microsecond))
			resp, err := tr.RoundTrip(relGet(t, context.Background(), "http://mem.test/"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(bodies) != 3 {
				t.Fatalf("%d tries, want 3", len(bodies))
			}
			for i, b := range bodies[:2] {
				if !b.closed.Load() {
					t.Errorf("retried body %d was not closed", i)
				}
				// At most 64 KiB, and one byte more to see the end of a body
				// of exactly 64 KiB.
				if got := b.read.Load(); got > drainLimit+1 {
					t.Errorf("retried body %d: read %d bytes, more than %d", i, got, drainLimit+1)
				}
				t.Logf("retried body %d: %d bytes read", i, b.read.Load())
			}
			if got := bodies[2].read.Load(); got != 0 {
				t.Errorf("the final body was read (%d bytes) before the caller got it", got)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Hostile headers: a server sends a megabyte of Retry-After or RateLimit.

func TestReliabilityHugeHeader(t *testing.T) {
	const mib = 1 << 20
	const date = "Sun, 06 Nov 1994 08:49:37 GMT"
	cases := []struct {
		name    string
		status  int
		headers map[string]string
		tries   int    // tries the server sees
		reason  string // why the last failure was not retried
	}{
		{"Retry-After digits", 503, map[string]string{"Retry-After": strings.Repeat("9", mib)}, 3, reasonAttempts},
		{"Retry-After spaces then 0", 429, map[string]string{"Retry-After": strings.Repeat(" ", mib) + "0"}, 3, reasonAttempts},
		{"Retry-After date-like", 503, map[string]string{"Retry-After": date + strings.Repeat("x", mib)}, 3, reasonAttempts},
		{"Date huge", 503, map[string]string{"Retry-After": date, "Date": date + strings.Repeat("x", mib)}, 3, reasonAttempts},
		// A megabyte of well-formed spent policies is no RateLimit field a
		// server really sends: it is refused unread, like garbage, and the
		// answer retried on backoff. Ten of them are read, and the reset of
		// 1 s, beyond the max, parks the host.
		{"RateLimit spent policies", 429, map[string]string{"Ratelimit": strings.Repeat(`"p";r=0;t=1,`, mib/12)}, 3, reasonAttempts},
		{"RateLimit ten spent policies", 429, map[string]string{"Ratelimit": strings.Repeat(`"p";r=0;t=1,`, 10)}, 1, reasonServerWait},
		{"RateLimit garbage", 503, map[string]string{"Ratelimit": strings.Repeat("A=;", mib/3)}, 3, reasonAttempts},
		{"X-RateLimit-Reset digits", 503, map[string]string{"X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": strings.Repeat("1", mib)}, 3, reasonAttempts},
		{"X-RateLimit with a huge Date", 503, map[string]string{"X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "1",
			"Date": date + strings.Repeat("x", mib)}, 1, reasonServerWait},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			relNoLeaks(t)
			var n atomic.Int64
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				for k, v := range c.headers {
					w.Header()[k] = []string{v}
				}
				w.WriteHeader(c.status)
			}), relServerOpts{})
			base := relH1Base()
			start := time.Now()
			out := relDo(t, base, relMethods[0].request(t, srv.URL))
			elapsed := time.Since(start)
			var delays []time.Duration
			for _, ev := range out.events {
				delays = append(delays, ev.Delay)
			}
			t.Logf("%d tries in %v, delays %v, refused: %s", n.Load(), elapsed, delays, out.reasons)
			if out.status != c.status || int(n.Load()) != c.tries {
				t.Errorf("status %d after %d tries, want %d after %d", out.status, n.Load(), c.status, c.tries)
			}
			if out.reasons != c.reason+";" {
				t.Errorf("refused: %q, want %q", out.reasons, c.reason)
			}
			for _, d := range delays {
				if d < 0 || d > 50*time.Millisecond {
					t.Errorf("delay %v outside [0, 50ms]", d)
				}
			}
			if elapsed > 5*time.Second {
				t.Errorf("took %v", elapsed)
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
	}

	// What the Transport itself allocates for such a response, with the
	// response made in advance by an in-memory base.
	t.Run("allocation", func(t *testing.T) {
		for _, c := range cases {
			h := make(http.Header)
			for k, v := range c.headers {
				h[k] = []string{v}
			}
			base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
				return relResponse(r, c.status, h, nil, 0), nil
			})
			tr := New(WithBase(base), WithBudget(nil), WithMaxAttempts(3),
				WithBackoff(time.Nanosecond, time.Nanosecond), WithRetryAfterLimits(time.Nanosecond, time.Nanosecond))
			req := relGet(t, context.Background(), "http://mem.test/")
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			alloc := (after.TotalAlloc - before.TotalAlloc) / uint64(c.tries)
			t.Logf("%s: %d bytes in %d allocations a try, %v for %d tries", c.name, alloc, (after.Mallocs-before.Mallocs)/uint64(c.tries), elapsed, c.tries)
			if alloc > 256<<10 {
				t.Errorf("%s: the Transport allocated %d bytes a try for a 1 MiB header", c.name, alloc)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Cancel and deadline.

// relWaitKind is a wait a request can be in when its context ends.
type relWaitKind struct {
	name string
	// With these options, against a server answering status (with
	// Retry-After: header when set), the next request waits in this kind
	// of wait; prime says a first request must put the Transport in that
	// state (take the only token, park the host).
	opts   []Option
	status int    // what the base answers
	header string // Retry-After of the base's answers
	prime  bool   // send one request first (to take the token, park the host)
}

var relWaitKinds = []relWaitKind{
	{
		name:   "backoff",
		opts:   []Option{WithBackoff(10*time.Second, 10*time.Second), WithRand(func() float64 { return 0.5 })},
		status: http.StatusServiceUnavailable,
	},
	{
		name:   "pace",
		opts:   []Option{WithPace(0.1, 1)}, // one every 10 s
		status: http.StatusOK,
		prime:  true,
	},
	{
		name:   "parked host",
		opts:   []Option{WithMaxAttempts(1)},
		status: http.StatusServiceUnavailable,
		header: "30",
		prime:  true,
	},
}

// TestReliabilityCancelDuringWait cancels a request while it waits, in
// each kind of wait, inside a synctest bubble: the request returns at the
// very instant of the cancel (time.Since is exactly the time to the
// cancel), with an error that errors.Is context.Canceled, and the response
// it was going to retry is closed.
func TestReliabilityCancelDuringWait(t *testing.T) {
	for _, k := range relWaitKinds {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu     sync.Mutex
					bodies []*relBody
					sent   int
				)
				base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					defer mu.Unlock()
					sent++
					b := relNewBody(10)
					bodies = append(bodies, b)
					h := make(http.Header)
					if k.header != "" {
						h.Set("Retry-After", k.header)
					}
					return relResponse(r, k.status, h, b, 10), nil
				})
				tr := New(append([]Option{WithBase(base), WithBudget(nil)}, k.opts...)...)
				if k.prime {
					resp, err := tr.RoundTrip(relGet(t, context.Background(), "http://wait.test/"))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				ctx, cancel := context.WithCancel(context.Background())
				sentBefore := sent
				var closedAtCancel bool
				go func() {
					time.Sleep(time.Second)
					mu.Lock()
					closedAtCancel = len(bodies) > 0 && bodies[len(bodies)-1].closed.Load()
					mu.Unlock()
					cancel()
				}()
				start := time.Now()
				resp, err := tr.RoundTrip(relGet(t, ctx, "http://wait.test/"))
				elapsed := time.Since(start)
				if resp != nil {
					resp.Body.Close()
					t.Fatalf("got a response (%d), want the cancel's error", resp.StatusCode)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("error %v does not wrap context.Canceled", err)
				}
				if elapsed != time.Second {
					t.Errorf("returned %v after the start, want exactly 1s (the cancel)", elapsed)
				}
				if k.name == "backoff" {
					if sent-sentBefore != 1 || !closedAtCancel {
						t.Errorf("%d tries, pending response closed before the cancel: %v; want 1 and true", sent-sentBefore, closedAtCancel)
					}
				} else if sent != sentBefore {
					t.Errorf("the cancelled request reached the base")
				}
			})
		})
	}
}

// TestReliabilityCancelLatency measures, on the real clock against a
// loopback server, how long a request takes to return after its context
// is cancelled in each kind of wait.
func TestReliabilityCancelLatency(t *testing.T) {
	const reps = 10
	for _, k := range relWaitKinds {
		t.Run(k.name, func(t *testing.T) {
			relNoLeaks(t)
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if k.header != "" {
					w.Header().Set("Retry-After", k.header)
				}
				w.WriteHeader(k.status)
			}), relServerOpts{})
			base := relH1Base()
			t.Cleanup(base.CloseIdleConnections)
			var lat []time.Duration
			for range reps {
				tr := New(append([]Option{WithBase(base), WithBudget(nil)}, k.opts...)...)
				if k.prime {
					resp, err := tr.RoundTrip(relGet(t, context.Background(), srv.URL))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				ctx, cancel := context.WithCancel(context.Background())
				var cancelledAt atomic.Int64
				go func() {
					time.Sleep(30 * time.Millisecond)
					cancelledAt.Store(time.Now().UnixNano())
					cancel()
				}()
				resp, err := tr.RoundTrip(relGet(t, ctx, srv.URL))
				returned := time.Now()
				if resp != nil {
					resp.Body.Close()
				}
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("error %v does not wrap context.Canceled", err)
				}
				lat = append(lat, returned.Sub(time.Unix(0, cancelledAt.Load())))
			}
			slices.Sort(lat)
			t.Logf("%s: return after cancel over %d runs: min %v, median %v, max %v", k.name, reps, lat[0], lat[reps/2], lat[reps-1])
			if lat[reps-1] > 100*time.Millisecond {
				t.Errorf("a cancel took %v to return", lat[reps-1])
			}
		})
	}
}

// TestReliabilityDeadline: nothing waits past the request's deadline. A
// wait that would end after it is not started; the last answer is
// returned at once (in a synctest bubble: after no time at all). A wait
// that fits is made, to the nanosecond.
func TestReliabilityDeadline(t *testing.T) {
	cases := []struct {
		name    string
		opts    []Option
		answers []int  // statuses the base gives, the last repeated
		header  string // Retry-After on 503s
		prime   bool
		// the outcome
		wantStatus  int
		wantErr     error
		wantElapsed time.Duration
		wantTries   int
	}{
		{
			name: "Retry-After 5s, deadline 2s", answers: []int{503}, header: "5",
			wantStatus: 503, wantElapsed: 0, wantTries: 1,
		},
		{
			name:    "backoff 5s, deadline 2s",
			opts:    []Option{WithBackoff(10*time.Second, 10*time.Second), WithRand(func() float64 { return 0.5 })},
			answers: []int{503}, wantStatus: 503, wantElapsed: 0, wantTries: 1,
		},
		{
			name: "pace slot in 10s, deadline 2s", opts: []Option{WithPace(0.1, 1)}, answers: []int{200}, prime: true,
			wantErr: context.DeadlineExceeded, wantElapsed: 0, wantTries: 0,
		},
		{
			name: "host parked 30s, deadline 2s", opts: []Option{WithMaxAttempts(1)}, answers: []int{503}, header: "30", prime: true,
			wantErr: ErrHostPaused, wantElapsed: 0, wantTries: 0,
		},
		{
			name: "Retry-After 1s fits a 2s deadline", answers: []int{503, 200}, header: "1",
			wantStatus: 200, wantElapsed: time.Second, wantTries: 2,
		},
		{
			name:    "backoff 1s fits a 2s deadline",
			opts:    []Option{WithBackoff(2*time.Second, 2*time.Second), WithRand(func() float64 { return 0.5 })},
			answers: []int{503, 200}, wantStatus: 200, wantElapsed: time.Second, wantTries: 2,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var tries atomic.Int64
				base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
					n := int(tries.Add(1)) - 1
					status := c.answers[min(n, len(c.answers)-1)]
					h := make(http.Header)
					if status == 503 && c.header != "" {
						h.Set("Retry-After", c.header)
					}
					return relResponse(r, status, h, nil, 0), nil
				})
				tr := New(append([]Option{WithBase(base), WithBudget(nil)}, c.opts...)...)
				if c.prime {
					resp, err := tr.RoundTrip(relGet(t, context.Background(), "http://deadline.test/"))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					tries.Store(0)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				start := time.Now()
				resp, err := tr.RoundTrip(relGet(t, ctx, "http://deadline.test/"))
				elapsed := time.Since(start)
				status := 0
				if resp != nil {
					status = resp.StatusCode
					resp.Body.Close()
				}
				got := fmt.Sprintf("status %d, err %v, after %v, %d tries", status, err, elapsed, tries.Load())
				if status != c.wantStatus || elapsed != c.wantElapsed || int(tries.Load()) != c.wantTries ||
					(c.wantErr == nil) != (err == nil) || (c.wantErr != nil && !errors.Is(err, c.wantErr)) {
					t.Errorf("got %s; want status %d, err %v, after %v, %d tries", got, c.wantStatus, c.wantErr, c.wantElapsed, c.wantTries)
				}
			})
		})
	}
}

// TestReliabilityDeadlineLoopback is the first case of
// TestReliabilityDeadline on the real clock: a server answers 503 with
// Retry-After: 5 to a request with a 2 s deadline, which gets the 503 at
// once, not after 2 s.
func TestReliabilityDeadlineLoopback(t *testing.T) {
	relNoLeaks(t)
	var n atomic.Int64
	srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
	}), relServerOpts{})
	base := relH1Base()
	t.Cleanup(base.CloseIdleConnections)
	tr := New(WithBase(base))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(relGet(t, ctx, srv.URL))
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("503 with Retry-After: 5 under a 2 s deadline returned after %v", elapsed)
	if resp.StatusCode != http.StatusServiceUnavailable || n.Load() != 1 {
		t.Errorf("status %d after %d tries, want 503 after 1", resp.StatusCode, n.Load())
	}
	if elapsed > 500*time.Millisecond {
		t.Errorf("took %v: the Transport waited toward a retry the deadline did not allow", elapsed)
	}
}

// TestReliabilityCancelledPaceWaitFreesSlot: a request cancelled while it
// waits for its pace slot never makes its attempt, so the slot must go back
// to the host's bucket (as rate.Limiter.Wait does), not push every later
// request one slot further out. With one slot per 10 s taken at 0 s, a
// request cancelled at 1 s and another sent at 1 s: the second should be
// sent at 10 s, not 20 s.
func TestReliabilityCancelledPaceWaitFreesSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sentAt []time.Duration
		start := time.Now()
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			sentAt = append(sentAt, time.Since(start))
			return relResponse(r, http.StatusOK, nil, nil, 0), nil
		})
		tr := New(WithBase(base), WithPace(0.1, 1))
		do := func(ctx context.Context) error {
			resp, err := tr.RoundTrip(relGet(t, ctx, "http://paced.test/"))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := do(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- do(ctx) }()
		time.Sleep(time.Second)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled request: %v", err)
		}
		if err := do(context.Background()); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]time.Duration{0, 10 * time.Second}, sentAt); diff != "" {
			t.Errorf("attempts sent at (-want +got):\n%s", diff)
		}
	})
}

// ---------------------------------------------------------------------------
// Per-host state: bounded, and never at the cost of a parking.

// relHostEntries counts the in-process limiter's host entries.
func relHostEntries(tr *Transport) int {
	l := tr.limiter.(*localLimiter)
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.hosts)
		s.mu.Unlock()
	}
	return n
}

// TestReliabilityHostStateBounded is a crawler: 20,000 hosts, each of
// which answers once with Retry-After: 1, one host every millisecond. The
// Transport holds only the hosts parked lately, not every host it met.
func TestReliabilityHostStateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			return relResponse(r, http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}, nil, 0), nil
		})
		tr := New(WithBase(base), WithMaxAttempts(1), WithPace(1000, 10))
		const hosts = 20_000
		peak := 0
		for i := range hosts {
			resp, err := tr.RoundTrip(relGet(t, context.Background(), fmt.Sprintf("http://h%d.crawl.test/", i)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if i%1000 == 999 {
				peak = max(peak, relHostEntries(tr))
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("%d hosts met, at most %d held (about 1,000 parked at any time)", hosts, peak)
		// A shard is swept when it doubles past the hosts it kept: with
		// about 1,000 hosts parked at a time, 64 shards hold a few
		// thousand at most.
		if peak > 2*shardCount*minSweep {
			t.Errorf("the Transport held %d hosts of %d", peak, hosts)
		}
	})
}

// TestReliabilityParkingSurvivesSweep parks one host for 30 s, then, at
// the same moment, a crowd of other hosts for 40 s each (a crawler meeting
// a rate-limited CDN). The in-process limiter sweeps idle hosts as it
// grows; none of these is idle, so every one must stay parked.
func TestReliabilityParkingSurvivesSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int64
		var checking atomic.Bool
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent.Add(1)
			if checking.Load() {
				// A request that got through is answered plainly, so that it
				// parks nothing and the count stays that of the first phase.
				return relResponse(r, http.StatusOK, nil, nil, 0), nil
			}
			wait := "40"
			if r.URL.Host == "first.test" {
				wait = "30"
			}
			return relResponse(r, http.StatusTooManyRequests, http.Header{"Retry-After": {wait}}, nil, 0), nil
		})
		tr := New(WithBase(base), WithMaxAttempts(1))
		do := func(ctx context.Context, host string) error {
			resp, err := tr.RoundTrip(relGet(t, ctx, "http://"+host+"/"))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		const crowd = 5000
		if err := do(context.Background(), "first.test"); err != nil {
			t.Fatal(err)
		}
		for i := range crowd {
			if err := do(context.Background(), fmt.Sprintf("c%d.test", i)); err != nil {
				t.Fatal(err)
			}
		}
		sent.Store(0)
		checking.Store(true)
		// Every host is parked: a request with a 1 s deadline fails at once.
		var leaked []string
		for i := -1; i < crowd; i++ {
			host := "first.test"
			if i >= 0 {
				host = fmt.Sprintf("c%d.test", i)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := do(ctx, host)
			cancel()
			if !errors.Is(err, ErrHostPaused) {
				leaked = append(leaked, host)
			}
		}
		if len(leaked) > 0 {
			t.Errorf("%d of %d parked hosts were sent a request (%d attempts), e.g. %q",
				len(leaked), crowd+1, sent.Load(), leaked[:min(3, len(leaked))])
		}
	})
}

// ---------------------------------------------------------------------------
// Security: idempotency keys, and what logs, events and errors let out.

var relUUIDv4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestReliabilityIdempotencyKeys: the keys WithAutoIdempotencyKey adds are
// UUID v4 from crypto/rand, one per request, the same on every retry of
// it, never one the caller already set, and the caller's request is left
// alone.
func TestReliabilityIdempotencyKeys(t *testing.T) {
	t.Run("format and uniqueness", func(t *testing.T) {
		const n = 20_000
		seen := make(map[string]bool, n)
		for range n {
			k := newIdempotencyKey()
			if !relUUIDv4.MatchString(k) {
				t.Fatalf("key %q is not a UUID v4", k)
			}
			if seen[k] {
				t.Fatalf("key %q made twice", k)
			}
			seen[k] = true
		}
	})
	t.Run("through the Transport", func(t *testing.T) {
		var (
			mu   sync.Mutex
			keys = make(map[string][]string) // request id -> key of each try
		)
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			id := r.Header.Get("X-Rel-Id")
			mu.Lock()
			keys[id] = append(keys[id], r.Header.Get("Idempotency-Key"))
			tries := len(keys[id])
			mu.Unlock()
			if r.Body != nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
			if tries < 3 {
				return relResponse(r, http.StatusServiceUnavailable, nil, nil, 0), nil
			}
			return relResponse(r, http.StatusOK, nil, nil, 0), nil
		})
		tr := New(WithBase(base), WithAutoIdempotencyKey(), WithBudget(nil),
			WithBackoff(time.Nanosecond, time.Nanosecond))
		const workers, each = 20, 50
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					method := http.MethodPost
					if i%2 == 1 {
						method = http.MethodPatch
					}
					req, _ := http.NewRequest(method, "http://keys.test/", strings.NewReader("body"))
					req.Header.Set("X-Rel-Id", fmt.Sprintf("%d-%d", w, i))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if len(req.Header) != 1 {
						t.Errorf("the caller's request was changed: %v", req.Header)
					}
				}
			})
		}
		wg.Wait()
		distinct := make(map[string]bool)
		for id, ks := range keys {
			if len(ks) != 3 || ks[0] != ks[1] || ks[1] != ks[2] || !relUUIDv4.MatchString(ks[0]) {
				t.Fatalf("request %s sent keys %q, want one UUID v4 three times", id, ks)
			}
			distinct[ks[0]] = true
		}
		if len(distinct) != workers*each {
			t.Errorf("%d distinct keys for %d requests", len(distinct), workers*each)
		}
	})
	t.Run("the caller's key is kept", func(t *testing.T) {
		for _, h := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
			var got []string
			base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
				got = append(got, r.Header.Get("Idempotency-Key")+"|"+r.Header.Get("X-Idempotency-Key"))
				return relResponse(r, http.StatusOK, nil, nil, 0), nil
			})
			tr := New(WithBase(base), WithAutoIdempotencyKey())
			req, _ := http.NewRequest(http.MethodPost, "http://keys.test/", strings.NewReader("b"))
			req.Header.Set(h, "mine")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := "mine|"
			if h != "Idempotency-Key" {
				want = "|mine"
			}
			if diff := cmp.Diff([]string{want}, got); diff != "" {
				t.Errorf("%s: keys sent (-want +got):\n%s", h, diff)
			}
		}
	})
}

const relSecret = "s3cret"

// relSecretRequest is a request that carries the secret everywhere a
// client puts one: the user info, the query, the Authorization and Cookie
// headers, and the body.
func relSecretRequest(t testing.TB, ctx context.Context, method, rawURL string, key bool) *http.Request {
	t.Helper()
	u := strings.Replace(rawURL, "://", "://user:"+relSecret+"@", 1) + "/v1/things?token=" + relSecret + "&x=1"
	var body io.Reader
	if method != http.MethodGet {
		body = strings.NewReader(`{"password":"` + relSecret + `"}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+relSecret)
	req.Header.Set("Cookie", "session="+relSecret)
	if key {
		req.Header.Set("Idempotency-Key", "key-"+relSecret)
	}
	return req
}

// TestReliabilityNoSecretsInLogs drives the Transport through every kind
// of retry and refusal with a request full of secrets: the JSON log, the
// RetryEvents as printed, and the errors' text never carry them.
func TestReliabilityNoSecretsInLogs(t *testing.T) {
	relNoLeaks(t)
	srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.Header.Get("X-Rel-Mode") {
		case "reset":
			relHijackReset(w)
		case "later":
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
		case "soon":
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("token=" + relSecret))
		}
	}), relServerOpts{})
	refused := relRefusedURL(t)
	base := relH1Base()
	t.Cleanup(base.CloseIdleConnections)

	var (
		logBuf bytes.Buffer
		logMu  sync.Mutex
		events []string
		errs   []string
	)
	logger := slog.New(slog.NewJSONHandler(relLockedWriter{&logMu, &logBuf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	newTr := func(extra ...Option) *Transport {
		return New(append([]Option{
			WithBase(base), WithLogger(logger), WithBudget(nil),
			WithBackoff(time.Millisecond, 2*time.Millisecond),
			WithRetryAfterLimits(time.Millisecond, 10*time.Second),
			WithOnRetry(func(ev RetryEvent) {
				logMu.Lock()
				events = append(events, fmt.Sprintf("%v\n%+v", ev, ev))
				logMu.Unlock()
			}),
		}, extra...)...)
	}
	cases := []struct {
		name, method, mode, url string
		key                     bool
		opts                    []Option
		deadline                bool
		noGetBody               bool
		twice                   bool // a second request meets the parked host
	}{
		{name: "503 out of attempts", method: http.MethodGet},
		{name: "503 on an unkeyed POST", method: http.MethodPost},
		{name: "reset", method: http.MethodPut, mode: "reset"},
		{name: "connection refused", method: http.MethodGet, url: refused},
		{name: "Retry-After beyond max, then parked", method: http.MethodGet, mode: "later", twice: true},
		{name: "Retry-After past the deadline", method: http.MethodGet, mode: "soon", deadline: true},
		{name: "budget spent", method: http.MethodGet, opts: []Option{WithBudget(NewBudget(0, 0))}},
		{name: "body without GetBody", method: http.MethodPost, key: true, noGetBody: true},
		{name: "keyed POST", method: http.MethodPost, key: true, mode: "reset"},
	}
	for _, c := range cases {
		url := srv.URL
		if c.url != "" {
			url = c.url
		}
		tr := newTr(c.opts...)
		for range 1 + relBtoi(c.twice) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if c.deadline {
				cancel()
				ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
			}
			req := relSecretRequest(t, ctx, c.method, url, c.key)
			req.Header.Set("X-Rel-Mode", c.mode)
			if c.noGetBody {
				req.GetBody = nil
			}
			resp, err := tr.RoundTrip(req)
			cancel()
			if resp != nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v | %+v | %s", c.name, err, err, err.Error()))
			}
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	log := logBuf.String()
	t.Logf("log:\n%s", log)
	t.Logf("errors:\n%s", strings.Join(errs, "\n"))
	for what, text := range map[string]string{
		"the log":    log,
		"the events": strings.Join(events, "\n"),
		"the errors": strings.Join(errs, "\n"),
	} {
		if strings.Contains(text, relSecret) {
			t.Errorf("%s carry the secret:\n%s", what, text)
		}
	}
	// The log said something useful all the same.
	for _, want := range []string{`"path":"/v1/things"`, `"reason":"` + reasonIdempotent, `"reason":"` + reasonBudget,
		`"reason":"` + reasonServerWait, `"reason":"` + reasonDeadline, `"reason":"` + reasonRewind, `"attempt":2`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s", want)
		}
	}
	if len(errs) < 4 || len(events) < 10 {
		t.Errorf("only %d errors and %d events: the cases did not run as meant", len(errs), len(events))
	}
}

func relBtoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// relLockedWriter serialises writes to a buffer.
type relLockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l relLockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestReliabilityRetryErrorRedactsWrappedURL: a base that reports its
// failures as *url.Error (one that delegates to an http.Client, say) puts
// the full URL, query included, in the error. The log strips it; the
// RetryError, whose own URL field is redacted, must not carry it in its
// text either.
func TestReliabilityRetryErrorRedactsWrappedURL(t *testing.T) {
	var logBuf bytes.Buffer
	base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, &url.Error{Op: "Get", URL: r.URL.String(), Err: syscall.ECONNRESET}
	})
	tr := New(WithBase(base), WithBudget(nil), WithBackoff(time.Nanosecond, time.Nanosecond),
		WithLogger(slog.New(slog.NewJSONHandler(&logBuf, nil))))
	_, err := tr.RoundTrip(relSecretRequest(t, context.Background(), http.MethodGet, "http://wrapped.test", false))
	if err == nil || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("error %v, want one that wraps ECONNRESET", err)
	}
	if strings.Contains(logBuf.String(), relSecret) {
		t.Errorf("the log carries the secret:\n%s", logBuf.String())
	}
	if strings.Contains(err.Error(), relSecret) {
		t.Errorf("the RetryError's text carries the query: %s", err)
	}
}

// TestReliabilityBaseReplays documents what net/http itself does under the
// Transport: when a reused keep-alive connection dies before the first
// byte of the answer, http.Transport sends the request again on a new
// connection, on its own, if the request is GET, HEAD, OPTIONS or TRACE or
// carries an idempotency key. The Transport neither sees nor counts that
// replay (WithMaxAttempts(1) here). It is safe, since only what may be
// repeated is replayed: a PUT and an unkeyed POST are executed once.
func TestReliabilityBaseReplays(t *testing.T) {
	want := map[string]int{"GET": 2, "PUT": 1, "POST+key": 2, "POST": 1}
	for _, m := range relMethods {
		t.Run(m.name, func(t *testing.T) {
			relNoLeaks(t)
			ex := &relExec{wantBody: m.body}
			srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/warm" {
					return // leaves a keep-alive connection in the pool
				}
				ex.act(r)
				relHijackReset(w)
			}), relServerOpts{})
			base := relH1Base()
			resp, err := base.RoundTrip(relGet(t, context.Background(), srv.URL+"/warm"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			out := relDo(t, base, m.request(t, srv.URL), WithMaxAttempts(1))
			t.Logf("%s: the Transport made %d try, the server acted %d times", m.name, out.attempts, ex.n.Load())
			if out.attempts != 1 || out.err == nil {
				t.Errorf("%d tries, err %v; want 1 and an error", out.attempts, out.err)
			}
			if got := int(ex.n.Load()); got > want[m.name] || (want[m.name] == 1 && got != 1) {
				t.Errorf("the server acted %d times, want %d", got, want[m.name])
			}
			relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
		})
	}
}

// TestReliabilitySlowRetriedBody: a server answers 503 and then trickles
// the body of that answer, a few bytes at a time. The Transport drains a
// retried response to reuse its connection, but a drain is no reason to
// wait on the server: the retry must not be held for as long as the server
// takes to finish a body nobody will read.
func TestReliabilitySlowRetriedBody(t *testing.T) {
	relNoLeaks(t)
	const trickle = 2 * time.Second
	var n atomic.Int64
	srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusServiceUnavailable)
		rc := http.NewResponseController(w)
		for i := range 20 {
			if _, err := w.Write(bytes.Repeat([]byte("s"), 50)); err != nil || rc.Flush() != nil {
				return
			}
			if i < 19 {
				select {
				case <-time.After(trickle / 20):
				case <-r.Context().Done():
					return
				}
			}
		}
	}), relServerOpts{})
	base := relH1Base()
	start := time.Now()
	out := relDo(t, base, relMethods[0].request(t, srv.URL))
	elapsed := time.Since(start)
	t.Logf("status %d after %d tries in %v (the server takes %v to finish the 503's body)", out.status, out.attempts, elapsed, trickle)
	if out.status != http.StatusOK || out.attempts != 2 {
		t.Fatalf("status %d after %d tries, want 200 after 2", out.status, out.attempts)
	}
	if elapsed > trickle/2 {
		t.Errorf("the retry waited %v on the body of the answer it retried", elapsed)
	}
	relWaitClosed(t, &srv.conns, base.CloseIdleConnections)
}
