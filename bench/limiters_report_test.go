package bench

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// limTable is the markdown table of one cell's results.
func limTable(cell limCell, results []limResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d workers, %d pages, %d req per %v allowed, %v latency, ideal time %v\n\n",
		cell.workers, limPages, cell.quota.limit, cell.quota.window, cell.latency, cell.ideal())
	b.WriteString("| middleware | library | fetched | requests | req/page | refused (429) | 429 back | errors | time | ideal | ratio |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		if r.client == "" {
			continue // not run: -run left it out
		}
		elapsed := fmt.Sprintf("%.1f s", r.elapsed.Seconds())
		if r.cut != "" {
			elapsed += " (cut: " + r.cut + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f | %d | %d | %d | %s | %s | %.2f |\n",
			r.middleware, r.client, r.fetched, r.requests, r.perPage(), r.refused, r.statusBack, r.errs,
			elapsed, seconds(r.cell.ideal()), r.ratio())
	}
	for _, r := range results {
		if r.firstErr != "" {
			fmt.Fprintf(&b, "\n%s/%s first error: %s", r.middleware, r.client, shorten(r.firstErr, 160))
		}
	}
	return b.String()
}

// seconds prints d in seconds, without a fraction when it has none.
func seconds(d time.Duration) string {
	s := d.Seconds()
	if s == math.Trunc(s) {
		return fmt.Sprintf("%.0f s", s)
	}
	return fmt.Sprintf("%.2f s", s)
}

// shorten cuts s to at most n bytes, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// logMatrix logs the table and what each middleware sent.
func logMatrix(t *testing.T, title string, cell limCell, results []limResult) {
	t.Helper()
	t.Logf("%s\n\n%s", title, limTable(cell, results))
	logged := map[string]bool{}
	for _, r := range results {
		if r.client != "" && !logged[r.middleware] {
			logged[r.middleware] = true
			t.Logf("%s headers (seen by the %s run):\n  %s", r.middleware, r.client, r.seen.describe())
		}
	}
}

// tableOnly reports whether LIMITERS_TABLE asks for the table without the
// assertions.
func tableOnly() bool { return os.Getenv("LIMITERS_TABLE") != "" }

// misses lists the targets a retryhttp run missed:
//
//   - every page fetched (targetMinFetched);
//   - at most targetMaxPerPage requests received per page fetched, where a
//     client can reach it (perPageReachable): not where even the cell's
//     floor (floorRequests: the opening burst refused) is over it;
//   - done within targetMaxTimeRatio times the cell's ideal time.
func misses(r limResult) []string {
	var out []string
	if r.fetched < targetMinFetched {
		out = append(out, fmt.Sprintf("fetched %d pages, want %d", r.fetched, targetMinFetched))
	}
	if r.perPageReachable() && r.perPage() > targetMaxPerPage {
		out = append(out, fmt.Sprintf("%.2f requests a page, want <= %.2f", r.perPage(), targetMaxPerPage))
	}
	if r.ratio() > targetMaxTimeRatio {
		out = append(out, fmt.Sprintf("took %.1f s = %.2f x the ideal %v, want <= %.2f x",
			r.elapsed.Seconds(), r.ratio(), r.cell.ideal(), targetMaxTimeRatio))
	}
	if r.cut != "" {
		out = append(out, "run cut short: "+r.cut)
	}
	return out
}

// perPageReachable reports whether any client could keep within
// targetMaxPerPage in the run's cell: whether the cell's floor is within
// it. With 100 workers and 10 allowed at once, 90 first tries are refused
// before any answer could tell the client so: 240 requests for 150 pages
// at the least, 1.60 a page.
func (r limResult) perPageReachable() bool {
	return float64(r.floor) <= targetMaxPerPage*limPages
}

// figures is a run's numbers, for a failure's message.
func (r limResult) figures() string {
	return fmt.Sprintf("fetched %d/%d, %d requests, %.2f a page (floor %.2f), %d refused, %d 429s handed back, %d errors, %.1f s = %.2f x the ideal %v; first error: %q",
		r.fetched, limPages, r.requests, r.perPage(), float64(r.floor)/limPages, r.refused, r.statusBack, r.errs,
		r.elapsed.Seconds(), r.ratio(), r.cell.ideal(), shorten(r.firstErr, 160))
}

// assertRetryhttpTargets applies assertCell to retryhttp's runs of
// runMatrix, which run made, unless LIMITERS_TABLE is set.
func assertRetryhttpTargets(t *testing.T, results []limResult, run func(*testing.T, limCell, limMiddleware, limClient) limResult) {
	t.Helper()
	if tableOnly() {
		t.Log("LIMITERS_TABLE is set: table only, targets not asserted")
		return
	}
	for i, r := range results {
		if r.client == "retryhttp" {
			mw, lc := limMiddlewares[i/len(limClients)], limClients[i%len(limClients)]
			assertCell(t, r, func(t *testing.T) limResult { return run(t, r.cell, mw, lc) })
		}
	}
}
