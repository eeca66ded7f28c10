package bench

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
)

// BenchmarkCost is issue 26's table of what retryhttp adds on the paths
// that should cost little, each row beside the bare client and, where the
// row means the same to them, the peers:
//
//   - norecord: a GET to a host without a record (every library);
//   - record: a GET to a host that answered one 503 a moment before and
//     so holds a record of the host model;
//   - othershold: a GET to a host without a record while 1,000 other hosts
//     hold one (each answered a 503);
//   - quota: a GET to a host whose every answer announces a quota of a
//     million a second, which the model learns and paces at, never waiting;
//   - pace: a GET through WithPace(1e9, 1000), which never waits (1e6
//     read the same here, the bare blocks between letting its burst
//     refill, but a loop of a few hundred ns an op outruns it: the core's
//     BenchmarkRoundTrip timed its waits, about 1 µs an op);
//   - retry: 503 then 200, zero jitter, learning on (lib=retryhttp) and off
//     (lib=retryhttp-nolearn), beside every peer.
//
// retryhttp runs with its defaults (the budget, learning) but a zero
// jitter (WithRand(0)); the peers as the harness configures them
// (peers_test.go). The bases are "mem" (a custom RoundTripper: retryhttp
// pays its nesting mark) and "memtr" (the same behind a plain
// *http.Transport: the default configuration's kind of base). Compare
// with benchstat -col /lib; cost.sh runs it interleaved.
func BenchmarkCost(b *testing.B) {
	for _, row := range costRows {
		b.Run("row="+row.name, func(b *testing.B) {
			for _, kind := range []string{"mem", "memtr"} {
				b.Run("base="+kind, func(b *testing.B) {
					for _, l := range row.libs {
						b.Run("lib="+l.name, func(b *testing.B) { benchCost(b, row, kind, l) })
					}
				})
			}
		})
	}
}

// A costRow is one row of the table: the answers of its host, a warm-up
// that gives retryhttp what the row needs (a record, others' records),
// and the libraries it is measured with.
type costRow struct {
	name     string
	answer   func(host string, n int64) (int, http.Header) // the n-th request's status and header, n from 1
	warm     func(b *testing.B, d doer, url string)
	attempts int64 // requests that reach the base for one operation
	libs     []costLib
}

// A costLib makes a doer over base for a row.
type costLib struct {
	name string
	make func(base http.RoundTripper) doer
}

// retryhttpDefaults is retryhttp as a user gets it, with a zero jitter so
// that a retry waits nothing.
func retryhttpDefaults(opts ...retryhttp.Option) func(http.RoundTripper) doer {
	return func(base http.RoundTripper) doer {
		all := append([]retryhttp.Option{retryhttp.WithBase(base), retryhttp.WithRand(func() float64 { return 0 })}, opts...)
		c := &http.Client{Transport: retryhttp.New(all...)}
		return func(req *http.Request, _ []byte) (*http.Response, error) { return c.Do(req) }
	}
}

var (
	costBare      = costLib{"bare", newBare}
	costRetryhttp = costLib{"retryhttp", retryhttpDefaults()}
	costPeers     = []costLib{{"retryablehttp", newRetryablehttp}, {"failsafehttp", newFailsafehttp}, {"rehttp", newRehttp}}

	plainHeader = memHeader
	quotaHeader = http.Header{
		"Content-Type":          {"text/plain; charset=utf-8"},
		"Content-Length":        {"2"},
		"Date":                  {"Mon, 02 Jan 2006 15:04:05 GMT"},
		"X-Ratelimit-Limit":     {"1000000"},
		"X-Ratelimit-Remaining": {"999999"},
		"X-Ratelimit-Reset":     {"1"},
	}

	costRows = []costRow{
		{
			name:     "norecord",
			answer:   func(string, int64) (int, http.Header) { return 200, plainHeader },
			attempts: 1,
			libs:     append([]costLib{costBare, costRetryhttp}, costPeers...),
		},
		{
			name: "record",
			answer: func(_ string, n int64) (int, http.Header) {
				if n == 1 {
					return 503, plainHeader
				}
				return 200, plainHeader
			},
			warm:     warmOne,
			attempts: 1,
			libs:     []costLib{costBare, costRetryhttp},
		},
		{
			name: "othershold",
			answer: func(host string, _ int64) (int, http.Header) {
				if host != "mem.test" {
					return 503, plainHeader
				}
				return 200, plainHeader
			},
			warm:     warmOthers,
			attempts: 1,
			libs:     []costLib{costBare, costRetryhttp},
		},
		{
			name:     "quota",
			answer:   func(string, int64) (int, http.Header) { return 200, quotaHeader },
			warm:     warmQuota,
			attempts: 1,
			libs:     []costLib{costBare, costRetryhttp},
		},
		{
			name:     "pace",
			answer:   func(string, int64) (int, http.Header) { return 200, plainHeader },
			attempts: 1,
			libs:     []costLib{costBare, {"retryhttp", retryhttpDefaults(retryhttp.WithPace(1e9, 1000))}},
		},
		{
			name: "retry",
			answer: func(_ string, n int64) (int, http.Header) {
				if n%2 == 1 {
					return 503, plainHeader
				}
				return 200, plainHeader
			},
			attempts: 2,
			libs: append([]costLib{costBare, costRetryhttp,
				{"retryhttp-nolearn", retryhttpDefaults(retryhttp.WithLearning(false))}}, costPeers...),
		},
	}
)

// warmOne sends the one request of the row that the host answers 503, not
// retried, so that it holds a record from then on.
func warmOne(b *testing.B, d doer, url string) {
	req, _ := http.NewRequestWithContext(retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicyNoRetry()), "GET", url, nil)
	resp, err := d(req, nil)
	if err != nil {
		b.Fatal(err)
	}
	drainClose(resp)
}

// warmOthers gives 1,000 other hosts a record each (one 503), then waits
// out the hold of the newest: until then, every answer is told to the
// records, in case it is of a burst they must hear of.
func warmOthers(b *testing.B, d doer, url string) {
	ctx := retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicyNoRetry())
	for i := range 1000 {
		req, _ := http.NewRequestWithContext(ctx, "GET", costURL(url, "h"+strconv.Itoa(i)+".test"), nil)
		resp, err := d(req, nil)
		if err != nil {
			b.Fatal(err)
		}
		drainClose(resp)
	}
	time.Sleep(1100 * time.Millisecond)
}

// warmQuota lets the model hear the quota once and make the host's record.
func warmQuota(b *testing.B, d doer, url string) {
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := d(req, nil)
	if err != nil {
		b.Fatal(err)
	}
	drainClose(resp)
}

// costURL is url with its host replaced.
func costURL(url, host string) string {
	if len(url) > 6 && url[:6] == "mem://" {
		return "mem://" + host + "/x"
	}
	return "http://" + host + "/x"
}

// costSetup is a library made ready for a row over a base of the given
// kind: its doer, warmed up, the request it sends, and the count of
// requests that reached the base.
type costSetup struct {
	d   doer
	req *http.Request
	n   *atomic.Int64
}

func newCostSetup(b *testing.B, row costRow, kind string, l costLib) costSetup {
	n := new(atomic.Int64)
	base := &costBase{answer: row.answer, n: n}
	var rt http.RoundTripper = base
	url := "http://mem.test/x"
	if kind == "memtr" {
		tr := &http.Transport{}
		tr.RegisterProtocol("mem", base)
		rt, url = tr, "mem://mem.test/x"
	}
	d := l.make(rt)
	if row.warm != nil {
		row.warm(b, d, url)
	}
	req, _ := http.NewRequest("GET", url, nil)
	return costSetup{d: d, req: req, n: n}
}

// do is one operation, which must end in a 200.
func (s costSetup) do(b *testing.B) {
	resp, err := s.d(s.req, nil)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
	drainClose(resp)
}

func benchCost(b *testing.B, row costRow, kind string, l costLib) {
	s := newCostSetup(b, row, kind, l)
	before := s.n.Load()
	b.ReportAllocs()
	ops := int64(0)
	cpu := cpuTime()
	for b.Loop() {
		s.do(b)
		ops++
	}
	b.StopTimer()
	reportCPU(b, cpu, ops)
	if got, want := s.n.Load()-before, ops*row.attempts; got != want {
		b.Fatalf("%d requests reached the base for %d operations, want %d", got, ops, want)
	}
}

// BenchmarkCostAdded is BenchmarkCost's rows paired with the bare client,
// as BenchmarkAddedGET pairs a GET: each round times a block of the row's
// operations through the bare client and a block through the library, back
// to back in alternating order, and added-ns/op is the median over rounds
// of the difference per operation. On a shared machine it is the steadiest
// of the figures; run it without -benchmem.
func BenchmarkCostAdded(b *testing.B) {
	for _, row := range costRows {
		b.Run("row="+row.name, func(b *testing.B) {
			for _, kind := range []string{"mem", "memtr"} {
				b.Run("base="+kind, func(b *testing.B) {
					for _, l := range row.libs[1:] {
						b.Run("lib="+l.name, func(b *testing.B) { benchCostAdded(b, row, kind, l) })
					}
				})
			}
		})
	}
}

func benchCostAdded(b *testing.B, row costRow, kind string, l costLib) {
	const block = 200
	bare, lib := newCostSetup(b, row, kind, row.libs[0]), newCostSetup(b, row, kind, l)
	run := func(s costSetup) time.Duration {
		start := time.Now()
		for range block {
			s.do(b)
		}
		return time.Since(start)
	}
	var diffs []float64
	for b.Loop() {
		var tbare, tlib time.Duration
		if len(diffs)%2 == 0 {
			tbare, tlib = run(bare), run(lib)
		} else {
			tlib, tbare = run(lib), run(bare)
		}
		diffs = append(diffs, float64(tlib-tbare)/block)
	}
	b.StopTimer()
	slices.Sort(diffs)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(diffs[len(diffs)/2], "added-ns/op")
}

// costBase answers from memory as its row says, counting the requests of
// the host under test.
type costBase struct {
	answer func(host string, n int64) (int, http.Header)
	n      *atomic.Int64
}

func (m *costBase) RoundTrip(req *http.Request) (*http.Response, error) {
	var n int64
	if req.URL.Host == "mem.test" {
		n = m.n.Add(1)
	}
	st, h := m.answer(req.URL.Host, n)
	return &http.Response{
		Status:        http.StatusText(st),
		StatusCode:    st,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          &cannedBody{s: "ok"},
		ContentLength: 2,
		Request:       req,
	}, nil
}
