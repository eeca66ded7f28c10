package retryhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// step is one scripted answer of a stub host.
type step struct {
	status  int
	headers map[string]string
	body    string
}

// hit is what a stub host saw of one request.
type hit struct {
	at     time.Time
	method string
	path   string
	host   string
	body   string
	key    string // Idempotency-Key
}

// stub is a scripted host: each path answers its script in order, the last
// step repeating; a path without a script answers 200 "ok". It records every
// request it reads.
type stub struct {
	mu      sync.Mutex
	scripts map[string][]step
	hits    []hit
	start   time.Time
}

func newStub(scripts map[string][]step) *stub {
	return &stub{scripts: scripts, start: time.Now()}
}

func (s *stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.hits = append(s.hits, hit{
		at: time.Now(), method: r.Method, path: r.URL.Path, host: r.Host,
		body: string(body), key: r.Header.Get("Idempotency-Key"),
	})
	n := 0
	for _, h := range s.hits {
		if h.path == r.URL.Path {
			n++
		}
	}
	script := s.scripts[r.URL.Path]
	s.mu.Unlock()
	st := step{status: http.StatusOK, body: "ok"}
	if len(script) > 0 {
		st = script[min(n, len(script))-1]
	}
	for k, v := range st.headers {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(st.body)))
	w.WriteHeader(st.status)
	io.WriteString(w, st.body)
}

// count is the number of requests seen, for one path or, with "", all.
func (s *stub) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.hits {
		if path == "" || h.path == path {
			n++
		}
	}
	return n
}

// seconds lists when each request came, in whole and fractional seconds since
// the stub was made (exact inside a synctest bubble).
func (s *stub) seconds() []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]float64, len(s.hits))
	for i, h := range s.hits {
		out[i] = h.at.Sub(s.start).Seconds()
	}
	return out
}

func (s *stub) all() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// serveLoopback starts h on a loopback httptest.Server, closed when the test
// ends.
func serveLoopback(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// pipeNet is an in-memory network for testing/synctest bubbles: a real
// http.Server and a real http.Transport talk over net.Pipe, whose blocking
// is durable, so virtual time advances while they wait. Every host name
// dials the same server.
type pipeNet struct {
	conns  chan net.Conn
	done   chan struct{}
	once   sync.Once
	srv    *http.Server
	tr     *http.Transport
	served sync.WaitGroup
	dials  atomic.Int32
}

// newPipeNet serves h over an in-memory network and returns it; its
// Transport is the base to give retryhttp. Call close before the bubble ends.
func newPipeNet(h http.Handler) *pipeNet {
	p := &pipeNet{conns: make(chan net.Conn), done: make(chan struct{})}
	p.srv = &http.Server{Handler: h}
	p.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			p.dials.Add(1)
			c, s := net.Pipe()
			select {
			case p.conns <- s:
				return c, nil
			case <-p.done:
				return nil, errors.New("pipenet: closed")
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}
	p.served.Add(1)
	go func() {
		defer p.served.Done()
		p.srv.Serve(pipeListener{p})
	}()
	return p
}

func (p *pipeNet) close() {
	p.tr.CloseIdleConnections()
	p.srv.Close()
	p.once.Do(func() { close(p.done) })
	p.served.Wait()
}

type pipeListener struct{ p *pipeNet }

func (l pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.p.conns:
		return c, nil
	case <-l.p.done:
		return nil, net.ErrClosed
	}
}

func (l pipeListener) Close() error {
	l.p.once.Do(func() { close(l.p.done) })
	return nil
}

func (l pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// get sends a GET through rt and returns the status and body, failing the
// test on a transport error.
func get(t *testing.T, rt http.RoundTripper, url string) (int, string) {
	t.Helper()
	resp, err := send(rt, http.MethodGet, url, "", nil)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, readAll(resp)
}

// send makes a request through rt, with headers and a rewindable body when
// body is non-empty.
func send(rt http.RoundTripper, method, url, body string, headers map[string]string) (*http.Response, error) {
	return sendCtx(context.Background(), rt, method, url, body, headers)
}

func sendCtx(ctx context.Context, rt http.RoundTripper, method, url, body string, headers map[string]string) (*http.Response, error) {
	var r io.Reader
	if body != "" {
		r = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return rt.RoundTrip(req)
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// countingBase counts the attempts that reach the base and the response
// bodies closed.
type countingBase struct {
	base     http.RoundTripper
	attempts atomic.Int32
	closes   atomic.Int32
	idle     atomic.Int32
}

func (c *countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	c.attempts.Add(1)
	resp, err := c.base.RoundTrip(req)
	if resp != nil {
		resp.Body = &closeCounter{ReadCloser: resp.Body, n: &c.closes}
	}
	return resp, err
}

func (c *countingBase) CloseIdleConnections() { c.idle.Add(1) }

type closeCounter struct {
	io.ReadCloser
	n *atomic.Int32
}

func (c *closeCounter) Close() error {
	c.n.Add(1)
	return c.ReadCloser.Close()
}

// events collects RetryEvents safely.
type events struct {
	mu  sync.Mutex
	all []RetryEvent
}

func (e *events) add(ev RetryEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) list() []RetryEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]RetryEvent(nil), e.all...)
}

// fixedRand makes the jitter deterministic: every draw is r.
func fixedRand(r float64) Option { return WithRand(func() float64 { return r }) }

// onEvents sends both hooks' events to f, in the order they happen: the
// tests read retries and refusals as one story.
func onEvents(f func(RetryEvent)) Option {
	return func(c *config) { WithOnRetry(f)(c); WithOnGiveUp(f)(c) }
}
