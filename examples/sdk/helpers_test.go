package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
)

// The stubs below answer from a script and record every request that
// reached them. Tests whose answers name a wait run in a synctest bubble, so
// a Retry-After of seconds costs no real time; a bubble cannot hold a real
// socket, so there the httptest server listens on an in-memory network of
// net.Pipe connections, still behind a real http.Server and http.Transport.

// reply is one scripted answer.
type reply struct {
	status int
	header map[string]string
	body   string
}

// hit is one request as the stub received it.
type hit struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
	Status              int // what the stub answered
}

// script answers the n-th request (from 1) that reached the stub.
type script func(n int, r *http.Request, body []byte) reply

// replies answers the n-th request with rs[n-1], and every request past
// the end with the last one.
func replies(rs ...reply) script {
	return func(n int, _ *http.Request, _ []byte) reply {
		return rs[min(n, len(rs))-1]
	}
}

type recorder struct {
	answer script
	mu     sync.Mutex
	hits   []hit
}

func (s *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// A body cut short is a failure of the client under test, not an
		// answer the script chose: the status says so.
		w.WriteHeader(http.StatusTeapot)
		return
	}
	s.mu.Lock()
	n := len(s.hits) + 1
	s.hits = append(s.hits, hit{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
	s.mu.Unlock()

	rep := s.answer(n, r, body)
	s.mu.Lock()
	s.hits[n-1].Status = rep.status
	s.mu.Unlock()
	for k, v := range rep.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(rep.status)
	io.WriteString(w, rep.body)
}

// Hits returns the requests that reached the stub, in order.
func (s *recorder) Hits() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// bubbleStub starts an httptest server answering from sc on an in-memory
// network. It must be called inside a synctest bubble; the server and its
// connections are gone when the test ends, so the bubble can end too.
// It returns the server's URL and a base transport that reaches it.
func bubbleStub(t *testing.T, sc script) (*recorder, string, http.RoundTripper) {
	t.Helper()
	rec := &recorder{answer: sc}
	l := newPipeListener()
	ts := &httptest.Server{Listener: l, Config: &http.Server{Handler: rec}}
	ts.Start()
	base := &http.Transport{DialContext: l.dial}
	t.Cleanup(func() {
		base.CloseIdleConnections()
		ts.Close()
	})
	return rec, ts.URL, base
}

// loopbackStub starts an httptest server answering from sc on loopback, for
// tests outside a bubble: uploads, which need no waits.
func loopbackStub(t *testing.T, sc script) (*recorder, *httptest.Server) {
	t.Helper()
	rec := &recorder{answer: sc}
	ts := httptest.NewServer(rec)
	t.Cleanup(ts.Close)
	return rec, ts
}

// pipeListener hands the server ends of net.Pipe connections to an
// http.Server; dial makes them.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr names a loopback address so that the URL the server reports is one
// the SDKs accept as an endpoint; nothing listens there.
func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "127.0.0.1:8080" }

// fast is retryhttp as a test uses it: defaults, but backoff in
// milliseconds, so that a retry without a server-named wait is quick in real
// time too. Server-named waits keep their 1 s floor and 60 s max.
func fast(base http.RoundTripper, opts ...retryhttp.Option) *http.Client {
	return retryhttp.NewClient(append([]retryhttp.Option{
		retryhttp.WithBase(base),
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
	}, opts...)...)
}

// layered is fast with learning and the budget off: the tests that count
// how an SDK's own retries multiply retryhttp's use it, so that a stub
// failing every time is tried every time. With the defaults, the budget
// refuses the retries of a host that fails every time beyond 10 % of first
// tries (and a reserve of one a second), and the host model finds it down
// within about a second of failures and hands the tries after that back at
// once with retryhttp.ErrHostDown: the multiplication stops sooner (minio's
// MaxRetries 0, below: 21 requests with the budget alone, 13 with both),
// but turn the SDK's retries off all the same.
func layered(base http.RoundTripper, opts ...retryhttp.Option) *http.Client {
	return fast(base, append([]retryhttp.Option{retryhttp.WithLearning(false), retryhttp.WithBudget(nil)}, opts...)...)
}

func statuses(hits []hit) string {
	s := make([]int, len(hits))
	for i, h := range hits {
		s[i] = h.Status
	}
	return fmt.Sprint(s)
}

// nextCallParked checks that call, made after an answer parked the host,
// fails with an error that is ErrHostPaused (and a *HostPausedError)
// without reaching the stub, which saw one request so far.
func nextCallParked(t *testing.T, rec *recorder, name string, call func() error) {
	t.Helper()
	err := call()
	var paused *retryhttp.HostPausedError
	if !errors.Is(err, retryhttp.ErrHostPaused) || !errors.As(err, &paused) {
		t.Errorf("the next %s: %v, want ErrHostPaused", name, err)
	}
	if hits := rec.Hits(); len(hits) != 1 {
		t.Errorf("the next %s reached the parked host: %s", name, statuses(hits))
	}
}
