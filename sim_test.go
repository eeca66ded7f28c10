package retryhttp

// Issue 24, item 2: the simulator of R18. It proves the Transport's
// defaults (New with only WithBase) over hosts drawn at random from
// families (simhosts_test.go), not over hand-tuned cells: for each draw a
// property that a perfect client with the same 3 tries meets. Only the
// exported API is used, so that the host model can be rewritten under it.
//
// Run:    go test -run TestSim -v
// Draws:  SIM_DRAWS=50 go test -run TestSim
// Replay: SIM_SEED=<family>:<seed> go test -run TestSim/<family> -v
//         (one draw, with a trace of every request; SIM_QUIET=1 without
//         it, as the batch runs the draw)

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// simHost decides each answer of a simulated host on the bubble's clock.
// serve may sleep (virtually); it returns when the answer is whole.
type simHost interface {
	serve(ctx context.Context) simAnswer
}

// simAnswer is one answer: a status and its headers, or a refused
// connection (nothing reached the host).
type simAnswer struct {
	status  int
	header  http.Header
	refused bool
}

// simSleep waits d on the bubble's clock, or until ctx ends (a call the
// Transport abandons stops holding its slot, as a real connection would).
func simSleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// simBase is the Transport's base: the host in memory, no sockets, so that a
// draw costs microseconds of CPU per request. It counts what reached the
// host and, when tracing, logs every request.
type simBase struct {
	host    simHost
	start   time.Time
	reached atomic.Int64 // answered by the host, whatever the status
	dials   atomic.Int64 // connections refused: sent, but reached nothing
	refused atomic.Int64 // answers other than 200
	trace   *simTrace
}

type simTrace struct {
	mu    sync.Mutex
	lines []string
}

// simLogWriter puts a replay's log lines in its trace, at the time they
// were written.
type simLogWriter struct{ base *simBase }

func (w simLogWriter) Write(p []byte) (int, error) {
	w.base.trace.add("%9.3fs log: %s", time.Since(w.base.start).Seconds(), strings.TrimSpace(string(p)))
	return len(p), nil
}

func (tr *simTrace) add(format string, args ...any) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

// errSimRefused is what a dial to a host refusing connections returns: the
// error net/http gives for ECONNREFUSED.
var errSimRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

func (b *simBase) RoundTrip(req *http.Request) (*http.Response, error) {
	at := time.Since(b.start)
	a := b.host.serve(req.Context())
	if a.refused {
		b.dials.Add(1)
		b.trace.add("%9.3fs %s: connection refused", at.Seconds(), req.URL.Path)
		return nil, errSimRefused
	}
	if err := req.Context().Err(); err != nil {
		b.reached.Add(1)
		b.trace.add("%9.3fs %s: abandoned by the caller", at.Seconds(), req.URL.Path)
		return nil, err
	}
	b.reached.Add(1)
	if a.status != http.StatusOK {
		b.refused.Add(1)
	}
	if b.trace != nil {
		b.trace.add("%9.3fs %s: %d in %v %s", at.Seconds(), req.URL.Path, a.status, time.Since(b.start)-at, simHeaderText(a.header))
	}
	body := "ok"
	if a.status != http.StatusOK {
		body = ""
	}
	h := a.header
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{
		Status: strconv.Itoa(a.status) + " " + http.StatusText(a.status), StatusCode: a.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
		Request: req,
	}, nil
}

func simHeaderText(h http.Header) string {
	var parts []string
	for k, v := range h {
		parts = append(parts, k+": "+strings.Join(v, ","))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// simPage is what one page's call came to.
type simPage struct {
	got        bool
	status     int    // the last answer's status; 0 with err
	err        string // "down", "paused", or the error's text
	start, dur time.Duration
}

// simRun is what one draw's run came to.
type simRun struct {
	pages   []simPage
	sent    int // requests that reached the host, and refused connections
	refused int // answers other than 200, and refused connections
	end     time.Duration
	longest time.Duration
	state   HostState
	trace   []string
}

// simDraw is one host drawn from a family, with what a perfect client gets
// from it: the figures the property is checked against.
type simDraw struct {
	params  string
	mk      func() simHost // called inside the bubble: its timers and channels must be the bubble's
	pages   int
	workers int
	// arrive, when set, hands page i out no sooner than i×arrive after the
	// start (callers arriving over time); else the workers take pages as
	// fast as they finish them.
	arrive time.Duration
	ideal  time.Duration // the perfect client's time for all pages
	slow   float64       // the time allowed, over ideal: 1.3, or 1.5 for a limit counting its refusals
	need   float64       // requests the perfect client sends, in all
	// minGot is how many pages must be got; owed, when set, says instead
	// which pages must be (an outage's pages before and after it).
	minGot int
	owed   func(simPage) bool
}

// simMaxWait bounds any single call: the Retry-After max (60 s), with a
// second for the tries' own latency around it.
const simMaxWait = 61 * time.Second

// simRequestsSlack is R18's bound: at most 1.25 times the requests the
// perfect client needs.
const simRequestsSlack = 1.25

// runSim runs one draw in its own bubble.
func runSim(t *testing.T, d simDraw, seed uint64, trace bool) simRun {
	var run simRun
	synctest.Test(t, func(t *testing.T) {
		base := &simBase{host: d.mk(), start: time.Now()}
		if trace {
			base.trace = &simTrace{}
		}
		// The jitter's source is seeded so that a replay sends what the
		// failing draw sent, as far as the goroutines' order allows;
		// no setting changes.
		var rmu sync.Mutex
		rnd := rand.New(rand.NewPCG(seed, 24))
		opts := []Option{WithBase(base), WithRand(func() float64 {
			rmu.Lock()
			defer rmu.Unlock()
			return rnd.Float64()
		})}
		if trace {
			// A replay also logs each retry decision and why a call
			// ends: an observer, which changes nothing that is sent.
			opts = append(opts, WithOnRetry(func(ev RetryEvent) {
				what := strconv.Itoa(ev.Status)
				if ev.Err != nil {
					what = ev.Err.Error()
				}
				next := "retry in " + ev.Delay.Round(time.Millisecond).String()
				if ev.Reason != "" {
					next = "no retry: " + string(ev.Reason)
				}
				base.trace.add("%9.3fs %s: try %d got %s, %s", time.Since(base.start).Seconds(), ev.Request.URL.Path, ev.Attempt, what, next)
			}))
			// And the model's changes of state and pace, as a user's
			// logger gets them.
			opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(simLogWriter{base}, &slog.HandlerOptions{
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
					if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
						return slog.Attr{}
					}
					return a
				}}))))
		}
		tr := New(opts...)
		client := &http.Client{Transport: tr}
		start := time.Now()
		run.pages = make([]simPage, d.pages)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range d.workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= d.pages {
						return
					}
					if d.arrive > 0 {
						time.Sleep(time.Until(start.Add(time.Duration(i) * d.arrive)))
					}
					run.pages[i] = simFetch(client, i, start)
				}
			})
		}
		wg.Wait()
		run.sent = int(base.reached.Load() + base.dials.Load())
		run.refused = int(base.refused.Load() + base.dials.Load())
		for _, p := range run.pages {
			run.end = max(run.end, p.start+p.dur)
			run.longest = max(run.longest, p.dur)
		}
		if st, err := tr.HostStatus(context.Background(), "sim.test"); err == nil {
			run.state = st.State
		}
		if trace {
			run.trace = base.trace.lines
		}
		tr.CloseIdleConnections()
	})
	return run
}

// simFetch is one page: one GET through the client, its body read.
func simFetch(client *http.Client, i int, start time.Time) simPage {
	// No caller waits forever; the bound is far past simMaxWait so that it
	// never decides a draw, only ends a runaway one.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := simPage{start: time.Since(start)}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://sim.test/p/"+strconv.Itoa(i), nil)
	resp, err := client.Do(req)
	switch {
	case err == nil:
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		p.status, p.got = resp.StatusCode, resp.StatusCode == http.StatusOK
	case errors.Is(err, ErrHostDown):
		p.err = "down"
	case errors.Is(err, ErrHostPaused):
		p.err = "paused"
	default:
		p.err = err.Error()
	}
	p.dur = time.Since(start) - p.start
	return p
}

// simCheck returns how the run misses the property, each miss a short tag
// ("pages", "requests", "time", "wait") with its figures; none when it holds.
func simCheck(d simDraw, r simRun) []string {
	var miss []string
	got, owedMissed := 0, 0
	for _, p := range r.pages {
		if p.got {
			got++
		} else if d.owed != nil && d.owed(p) {
			owedMissed++
		}
	}
	if d.owed != nil && owedMissed > 0 {
		miss = append(miss, fmt.Sprintf("pages: %d owed pages not got", owedMissed))
	}
	if d.owed == nil && got < d.minGot {
		miss = append(miss, fmt.Sprintf("pages: got %d, want at least %d", got, d.minGot))
	}
	if lim := simRequestsSlack * d.need; float64(r.sent) > lim {
		miss = append(miss, fmt.Sprintf("requests: %d (%.2f a page), want at most %.0f", r.sent, float64(r.sent)/float64(d.pages), lim))
	}
	if lim := time.Duration(d.slow * float64(d.ideal)); r.end > lim {
		miss = append(miss, fmt.Sprintf("time: %v (%.2fx ideal %v), want at most %.1fx", r.end.Round(time.Millisecond), float64(r.end)/float64(d.ideal), d.ideal.Round(time.Millisecond), d.slow))
	}
	if r.longest > simMaxWait {
		miss = append(miss, fmt.Sprintf("wait: a call took %v, want at most %v", r.longest.Round(time.Millisecond), simMaxWait))
	}
	return miss
}

// simFigures is a run's figures, for a failing draw's log.
func simFigures(d simDraw, r simRun) string {
	got := 0
	errs := map[string]int{}
	for _, p := range r.pages {
		if p.got {
			got++
			continue
		}
		k := p.err
		if k == "" {
			k = strconv.Itoa(p.status)
		}
		errs[k]++
	}
	var es []string
	for k, n := range errs {
		es = append(es, fmt.Sprintf("%s×%d", k, n))
	}
	slices.Sort(es)
	return fmt.Sprintf("got %d/%d (must %d), sent %d (need %.0f), refused %d, done %v (ideal %v, %.2fx), longest call %v, state %v, lost: %s",
		got, d.pages, d.minGot, r.sent, d.need, r.refused, r.end.Round(time.Millisecond), d.ideal.Round(time.Millisecond),
		float64(r.end)/float64(d.ideal), r.longest.Round(time.Millisecond), r.state, strings.Join(es, " "))
}

// simFamilySeed keys each family's draws apart: draw i of two families are
// different hosts.
func newSimRand(family string, seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, simFamilySeed(family)))
}

func simFamilySeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// simDraws is how many draws each family gets: 200 (SIM_DRAWS overrides);
// under -race 100. All families' 200 draws cost about 19 s of CPU without
// the race detector and about 136 s with it: 2.2 to 4.5 min on two cores
// shared with other work, past the 3 min budgeted to CI; 100 is half that.
func simDraws(t *testing.T) int {
	if v := os.Getenv("SIM_DRAWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SIM_DRAWS=%q: want a positive count", v)
		}
		return n
	}
	if simRace {
		return 100
	}
	return 200
}

// simLogAll (SIM_ALL=1) logs every miss of a known family, not only the
// first of each kind: to see which parameters the misses share.
var simLogAll = os.Getenv("SIM_ALL") != ""

func TestSim(t *testing.T) {
	replayFamily, replaySeed, replay := "", uint64(0), false
	if v := os.Getenv("SIM_SEED"); v != "" {
		f, s, ok := strings.Cut(v, ":")
		n, err := strconv.ParseUint(s, 10, 64)
		if !ok || err != nil {
			t.Fatalf("SIM_SEED=%q: want <family>:<seed>", v)
		}
		replayFamily, replaySeed, replay = f, n, true
	}
	draws := simDraws(t)
	for _, fam := range simFamilies {
		t.Run(fam.name, func(t *testing.T) {
			if replay {
				if fam.name != replayFamily {
					t.Skip("SIM_SEED names another family")
				}
				simReplay(t, fam, replaySeed)
				return
			}
			t.Parallel()
			simFamilyRun(t, fam, draws)
		})
	}
}

// simReplay runs one draw and logs its parameters, figures and trace.
func simReplay(t *testing.T, fam simFamily, seed uint64) {
	d := fam.draw(newSimRand(fam.name, seed))
	// SIM_QUIET=1 replays without the trace's logger and hooks, which
	// change the order of the bubble's goroutines: the draw as the batch
	// runs it, its figures only.
	r := runSim(t, d, seed, os.Getenv("SIM_QUIET") == "")
	for _, l := range r.trace {
		t.Log(l)
	}
	t.Logf("%s:%d %s", fam.name, seed, d.params)
	t.Logf("%s", simFigures(d, r))
	if miss := simCheck(d, r); len(miss) > 0 {
		t.Errorf("%s:%d misses: %s", fam.name, seed, strings.Join(miss, "; "))
	}
}

func simFamilyRun(t *testing.T, fam simFamily, draws int) {
	known, isKnown := simKnownMisses[fam.name]
	kinds := map[string]int{}
	firstSeed := map[string]uint64{}
	missed := 0
	for i := range draws {
		seed := uint64(i)
		d := fam.draw(newSimRand(fam.name, seed))
		r := runSim(t, d, seed, false)
		miss := simCheck(d, r)
		if len(miss) == 0 {
			continue
		}
		missed++
		var tags []string
		for _, m := range miss {
			tag, _, _ := strings.Cut(m, ":")
			tags = append(tags, tag)
		}
		kind := strings.Join(tags, "+")
		if kinds[kind] == 0 {
			firstSeed[kind] = seed
		}
		kinds[kind]++
		msg := fmt.Sprintf("%s:%d %s\n\t%s\n\tmisses: %s\n\treplay: SIM_SEED=%s:%d go test -run TestSim/%s -v",
			fam.name, seed, d.params, simFigures(d, r), strings.Join(miss, "; "), fam.name, seed, fam.name)
		switch {
		case !isKnown:
			t.Error(msg)
		case kinds[kind] == 1 || simLogAll:
			t.Log(msg) // the first of each kind, to see the typical miss
		}
	}
	var ks []string
	for k, n := range kinds {
		ks = append(ks, fmt.Sprintf("%s %d (seed %d)", k, n, firstSeed[k]))
	}
	slices.Sort(ks)
	t.Logf("%s: %d of %d draws miss: %s", fam.name, missed, draws, strings.Join(ks, ", "))
	// The README's row for the family: the most common kind of miss is
	// the typical one, with the first seed that shows it.
	typical := "none"
	if missed > 0 {
		top := ""
		for k, n := range kinds {
			if n > kinds[top] || n == kinds[top] && k < top {
				top = k
			}
		}
		typical = fmt.Sprintf("%s (%d), seed %d", top, kinds[top], firstSeed[top])
	}
	t.Logf("| %s | %s | %d | %d | %s |", fam.name, fam.ranges, draws, missed, typical)
	if isKnown && missed == 0 {
		t.Logf("%s now passes every draw: remove it from simKnownMisses (%s)", fam.name, known.reason)
	}
}

// simKnownMiss is a family the current host model misses, with why and a
// seed that replays the typical miss. Its draws log instead of failing, so
// that CI stays green while the model is rewritten (issue 24); the
// property is not loosened for it.
type simKnownMiss struct {
	reason string
	seed   uint64
}
