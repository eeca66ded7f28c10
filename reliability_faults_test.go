package retryhttp

// Reliability under network faults, on real loopback servers: for each
// fault (refused, resets, a server that never answers, cut-off bodies,
// HTTP/2 stream and connection resets, GOAWAY), the server acts on a GET,
// a PUT, a keyed POST and an unkeyed POST as many times as the rules allow
// and no more, and nothing leaks. Also what net/http replays on its own
// under the Transport. Issue 4.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

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
				return relTarget{url: "http://" + closedPort(t), base: relH1Base()}
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
						onEvents(func(ev RetryEvent) { mu.Lock(); events = append(events, ev); mu.Unlock() }))

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
						} else if wantB == 0 && events[0].Reason != ReasonNotIdempotent {
							t.Errorf("unkeyed POST after GOAWAY: reason %q, want %q", events[0].Reason, ReasonNotIdempotent)
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
