package bench

import (
	"context"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/hashicorp/go-cleanhttp"
)

// TestLimitersLoopback is TestLimiters on a real network and the real
// clock: each middleware x library pair gets an httptest.Server on
// 127.0.0.1 and a cleanhttp pooled transport. It confirms the virtual
// figures once. The pairs are parallel subtests that mostly sleep, so
// -parallel 8 runs them all at once and the whole lasts as long as the
// slowest pair (about 20 s today, at most the cell's deadline); with the default
// -parallel (GOMAXPROCS) it takes about 45 s on 2 cores. It runs only when
// asked:
//
//	LIMITERS_LOOPBACK=1 go test -run TestLimitersLoopback -v -parallel 8 .
//
// LIMITERS_TABLE=1 prints the table without asserting retryhttp's targets,
// as in TestLimiters.
func TestLimitersLoopback(t *testing.T) {
	if os.Getenv("LIMITERS_LOOPBACK") == "" {
		t.Skip("real-clock run over loopback: set LIMITERS_LOOPBACK=1 to run it (about 20 s with -parallel 8)")
	}
	results := runMatrix(t, refCell, runLoopback)
	logMatrix(t, "Against real rate limiters (real clock, loopback, ~1 ms added latency):", refCell, results)
	assertRetryhttpTargets(t, results, runLoopback)
}

// runLoopback runs one middleware x library pair over real loopback.
func runLoopback(t *testing.T, cell limCell, mw limMiddleware, lc limClient) limResult {
	ctx, cancel := context.WithTimeout(context.Background(), cell.deadline())
	defer cancel()
	srv := newLimServer(mw, cell, cancel)
	ts := httptest.NewServer(srv.handler)
	defer ts.Close()
	tr := cleanhttp.DefaultPooledTransport()
	defer tr.CloseIdleConnections()
	res := fetchAll(ctx, lc.make(tr), ts.URL, cell.workers, srv)
	res.middleware, res.client, res.cell = mw.name, lc.name, cell
	res.floor = cell.floorRequests(mw)
	res.seen = &srv.seen
	return res
}
