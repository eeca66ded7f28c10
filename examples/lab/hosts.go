package main

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The stub hosts of the seeds, as http.Handlers that read the lab's clock.
// Their behaviour follows seed 002's nimbu_lab.py and seed 000's stub.

// shopLatency is what a request to seed 002's shop takes, there and back.
const shopLatency = 50 * time.Millisecond

// loopbackLatency is what a request to seed 000's stub takes: it ran on
// loopback, where a request costs well under a millisecond.
const loopbackLatency = time.Millisecond

// Network is the lab's network: an http.RoundTripper that hands each request
// to the handler of its host, at the virtual time it is sent, and returns the
// answer the host's latency later, sleeping on the clock meanwhile (a request
// in flight is a waiting participant). Naive loops use it as the Transport
// of a plain http.Client; retryhttp uses it through WithBase.
type Network struct {
	clock *Clock
	hosts map[string]*Host
}

// Host is one stub host.
type Host struct {
	Name    string
	Latency time.Duration
	// Refusal, when not zero, is what an answer of 503 takes instead of
	// Latency: a refusal given at once, before any work, comes back sooner
	// than a page.
	Refusal time.Duration
	Handler http.Handler
	Log     *AccessLog
}

// NewNetwork returns a network with no hosts, on clock.
func NewNetwork(clock *Clock) *Network {
	return &Network{clock: clock, hosts: make(map[string]*Host)}
}

// Add registers a host under name, logging every request it answers.
func (n *Network) Add(name string, latency time.Duration, h http.Handler) *Host {
	host := &Host{Name: name, Latency: latency, Handler: h, Log: &AccessLog{clock: n.clock}}
	n.hosts[name] = host
	return host
}

// RoundTrip serves req with its host's handler through an
// httptest.ResponseRecorder.
func (n *Network) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		defer req.Body.Close()
	}
	host := n.hosts[strings.ToLower(req.URL.Host)]
	if host == nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("no such host %q in the lab", req.URL.Host)}
	}
	in := req.Clone(req.Context()) // what the server sees
	in.RequestURI = req.URL.RequestURI()
	in.Host = req.URL.Host
	rec := httptest.NewRecorder()
	host.Handler.ServeHTTP(rec, in)
	host.Log.add(rec.Code)
	latency := host.Latency
	if rec.Code == http.StatusServiceUnavailable && host.Refusal > 0 {
		latency = host.Refusal
	}
	if err := n.clock.Sleep(req.Context(), latency); err != nil {
		return nil, err
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

// AccessLog is what a host saw: one entry per request.
type AccessLog struct {
	clock   *Clock
	mu      sync.Mutex
	entries []entry
}

type entry struct {
	at     time.Duration // since the start of the scenario
	status int
}

func (l *AccessLog) add(status int) {
	at := l.clock.Since()
	l.mu.Lock()
	l.entries = append(l.entries, entry{at, status})
	l.mu.Unlock()
}

// Requests is the number of requests the host answered.
func (l *AccessLog) Requests() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

// Count is the number of answers with the given status.
func (l *AccessLog) Count(status int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.entries {
		if e.status == status {
			n++
		}
	}
	return n
}

// LargestBurst is the most requests that arrived at one instant after the
// start: collectors that wait the same time come back together, in waves.
func (l *AccessLog) LargestBurst() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := make(map[time.Duration]int)
	most := 0
	for _, e := range l.entries {
		if e.at > 0 {
			at[e.at]++
			most = max(most, at[e.at])
		}
	}
	return most
}

// Arrivals is when each request reached the host, since the start of the
// scenario, in the order they came.
func (l *AccessLog) Arrivals() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := make([]time.Duration, len(l.entries))
	for i, e := range l.entries {
		at[i] = e.at
	}
	return at
}

// FirstBusySecond is the start of the first whole second, from the one that
// begins at from on, in which the host answered at least n requests with
// status; ok is false if there was none.
func (l *AccessLog) FirstBusySecond(from time.Duration, status, n int) (at time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	per := make(map[time.Duration]int)
	first := time.Duration(-1)
	for _, e := range l.entries {
		s := e.at.Truncate(time.Second)
		if e.status != status || s < from {
			continue
		}
		per[s]++
		if per[s] >= n && (first < 0 || s < first) {
			first = s
		}
	}
	return first, first >= 0
}

// Between is the number of answers with the given status, or of all
// answers when status is 0, that the host gave from from until before to.
func (l *AccessLog) Between(from, to time.Duration, status int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.entries {
		if e.at >= from && e.at < to && (status == 0 || e.status == status) {
			n++
		}
	}
	return n
}

// BusiestSecond is the most requests the host answered in one whole
// second, of the seconds that begin at from or later, and the start of the
// first such second.
func (l *AccessLog) BusiestSecond(from time.Duration) (most int, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	per := make(map[time.Duration]int)
	for _, e := range l.entries {
		if s := e.at.Truncate(time.Second); s >= from {
			per[s]++
		}
	}
	for s, n := range per {
		if n > most || (n == most && s < at) {
			most, at = n, s
		}
	}
	return most, at
}

// elapsed is the virtual time since epoch, in seconds, as the Python shop
// counts it.
func elapsed(c *Clock) float64 { return c.Since().Seconds() }

// PriceAPI is seed 002's bazaar.nimbu.test/api/v1/prices: a token bucket of
// 5 tokens that gains 1 a second, one token per request, and 429 with
// Retry-After in whole seconds (the ceiling of the wait) when it is empty.
type PriceAPI struct {
	clock    *Clock
	mu       sync.Mutex
	capacity float64
	rate     float64 // tokens a second
	tokens   float64
	at       float64 // when tokens was counted, in seconds since epoch
}

// NewPriceAPI returns the price API with a full bucket.
func NewPriceAPI(c *Clock) *PriceAPI {
	return &PriceAPI{clock: c, capacity: 5, rate: 1, tokens: 5}
}

func (p *PriceAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	page, err := strconv.Atoi(r.URL.Query().Get("page"))
	if err != nil || page < 1 || page > 20 {
		http.Error(w, "no such page", http.StatusNotFound)
		return
	}
	ok, wait := p.take(elapsed(p.clock))
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait))))
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintln(w, `{"error": "5 requests at once, then 1 a second"}`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"page": %d}`+"\n", page)
}

// take spends a token: (true, 0), or (false, seconds until the next one).
func (p *PriceAPI) take(now float64) (bool, float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tokens = min(p.capacity, p.tokens+(now-p.at)*p.rate)
	p.at = now
	if p.tokens >= 1-1e-9 {
		p.tokens--
		return true, 0
	}
	return false, (1 - p.tokens) / p.rate
}

// httpDate is an HTTP date for a moment offset from the lab's clock, as Date
// and Retry-After carry it (whole seconds).
func httpDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

// Board is seed 002's flaky.nimbu.test/board: closed for maintenance for
// the first 90 s, 503 with Retry-After as an HTTP date and a Date header,
// both by the host's own clock, which runs Skew from the lab's.
type Board struct {
	clock  *Clock
	Closed time.Duration // from the start of the scenario
	Skew   time.Duration // the host's clock minus the lab's: -40 s is 40 s behind
}

func (b *Board) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := b.clock.Now()
	w.Header().Set("Date", httpDate(now.Add(b.Skew)))
	if now.Sub(epoch) < b.Closed {
		w.Header().Set("Retry-After", httpDate(epoch.Add(b.Closed).Add(b.Skew)))
		http.Error(w, "the price board is being rebuilt", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "price board: 40 rows")
}

// Stock is seed 002's flaky.nimbu.test/stock: it serves 5 requests in each
// whole second and answers the rest 503, without Retry-After, because an
// overloaded host cannot know when it will recover.
//
// With Then above zero, its capacity changes mid-run: PerSecond a second
// before After (since the start of the scenario), Then a second from After
// on.
type Stock struct {
	clock     *Clock
	PerSecond int
	Then      int
	After     time.Duration
	mu        sync.Mutex
	seen      map[int64]int
}

// capacity is how many requests the host serves in the second that holds now.
func (s *Stock) capacity(now time.Time) int {
	if s.Then > 0 && now.Sub(epoch) >= s.After {
		return s.Then
	}
	return s.PerSecond
}

func (s *Stock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := s.clock.Now()
	w.Header().Set("Date", httpDate(now))
	s.mu.Lock()
	if s.seen == nil {
		s.seen = make(map[int64]int)
	}
	s.seen[now.Unix()]++
	busy := s.seen[now.Unix()] > s.capacity(now)
	s.mu.Unlock()
	if busy {
		http.Error(w, "too busy", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "stock of item %s: 12\n", r.URL.Query().Get("item"))
}

// Quota is a host that announces its quota: a fixed window of Limit
// requests a second, the windows aligned to the start of the scenario. Every
// answer says X-RateLimit-Limit, X-RateLimit-Remaining (what is left in
// this window) and X-RateLimit-Reset (whole seconds until the window ends,
// rounded up); a request beyond the quota gets 429 with Retry-After: 1, and
// does not count against the window.
type Quota struct {
	clock  *Clock
	Limit  int
	mu     sync.Mutex
	window int64 // the current window, in whole seconds since the start
	used   int   // requests served in it
}

func (q *Quota) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := q.clock.Now()
	since := now.Sub(epoch)
	q.mu.Lock()
	if win := int64(since / time.Second); win != q.window {
		q.window, q.used = win, 0
	}
	ok := q.used < q.Limit
	if ok {
		q.used++
	}
	left := q.Limit - q.used
	end := time.Duration(q.window+1) * time.Second
	q.mu.Unlock()

	h := w.Header()
	h.Set("Date", httpDate(now))
	h.Set("X-RateLimit-Limit", strconv.Itoa(q.Limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(left))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(int64((end-since+time.Second-1)/time.Second), 10))
	if !ok {
		h.Set("Retry-After", "1")
		http.Error(w, "quota spent: 10 requests a second", http.StatusTooManyRequests)
		return
	}
	fmt.Fprintf(w, "page %s\n", r.URL.Query().Get("page"))
}

// Outage is seed 002's flaky.nimbu.test/catalogue while the host is down:
// 503 to everything, without Retry-After.
type Outage struct{ clock *Clock }

func (o *Outage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Date", httpDate(o.clock.Now()))
	http.Error(w, "the catalogue is down", http.StatusServiceUnavailable)
}

// Forbidden is seed 000's stub: 403, Retry-After: 0, an empty body.
type Forbidden struct{}

func (Forbidden) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Server", "Varnish")
	w.Header().Set("Retry-After", "0")
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusForbidden)
}

// Blip is seed 000's other case: a transient 503 that says Retry-After:
// 86400, then 200 once the blip is over.
type Blip struct {
	clock *Clock
	For   time.Duration
}

func (b *Blip) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.clock.Since() < b.For {
		w.Header().Set("Retry-After", "86400")
		http.Error(w, "try again tomorrow", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Replicas is a host behind a load balancer that hands requests to its
// replicas in turn. One replica of Every is broken: the request it gets,
// one in Every, is answered 503 at once, without Retry-After; the others
// are served. However fast or slow it is asked, the same share fails: load
// does not explain it.
type Replicas struct {
	clock *Clock
	Every int
	mu    sync.Mutex
	n     int
}

func (r *Replicas) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Date", httpDate(r.clock.Now()))
	r.mu.Lock()
	r.n++
	broken := r.n%r.Every == 0 // the last replica of each turn
	r.mu.Unlock()
	if broken {
		http.Error(w, "replica 5: no database connection", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "page %s\n", req.URL.Query().Get("page"))
}

// Restarted is a host that answers 503 to everything, without Retry-After,
// from Down until Up (since the start of the scenario), and serves before
// and after: an outage with a recovery.
type Restarted struct {
	clock    *Clock
	Down, Up time.Duration
}

func (h *Restarted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := h.clock.Now()
	w.Header().Set("Date", httpDate(now))
	if since := now.Sub(epoch); since >= h.Down && since < h.Up {
		http.Error(w, "the service is restarting", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "order %s\n", r.URL.Query().Get("order"))
}

// Slots is a host that serves Size requests at a time, each for Work (the
// Latency it is added with), and answers a request beyond them 503 at
// once, without Retry-After: a server with a fixed pool of workers and no
// queue. A slot is free again when its request's Work is over.
type Slots struct {
	clock *Clock
	Size  int
	Work  time.Duration
	mu    sync.Mutex
	ends  []time.Time // when each request in service is done
}

func (s *Slots) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := s.clock.Now()
	w.Header().Set("Date", httpDate(now))
	if !s.take(now) {
		http.Error(w, fmt.Sprintf("all %d workers are busy", s.Size), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "page %s\n", r.URL.Query().Get("page"))
}

// take frees the slots whose work is done by now, and takes one if any is
// free.
func (s *Slots) take(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := s.ends[:0]
	for _, end := range s.ends {
		if end.After(now) {
			busy = append(busy, end)
		}
	}
	s.ends = busy
	if len(s.ends) >= s.Size {
		return false
	}
	s.ends = append(s.ends, now.Add(s.Work))
	return true
}
