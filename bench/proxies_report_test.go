package bench

import (
	"fmt"
	"slices"
	"strings"
)

// proxyMisses are the gates a run misses: every page; at most
// proxyGateMaxPerPage x the cell's floor requests a page at the proxy;
// within proxyGateMaxRatio (proxyGateCountingRate where the limit counts
// its denials) x the cell's ideal time.
func proxyMisses(r proxyRun) []string {
	var out []string
	if r.got < r.cell.pages {
		out = append(out, fmt.Sprintf("got %d of %d pages (%s)", r.got, r.cell.pages, kindsString(r.kinds)))
	}
	if want := proxyGateMaxPerPage * r.cell.floor; r.perPageProxy() > want {
		out = append(out, fmt.Sprintf("%.2f requests a page, want <= %.2f", r.perPageProxy(), want))
	}
	want := proxyGateMaxRatio
	if r.cell.counting {
		want = proxyGateCountingRate
	}
	if r.ratio() > want {
		out = append(out, fmt.Sprintf("%.1f s = %.2f x the ideal %v, want <= %.1f x", r.elapsed.Seconds(), r.ratio(), r.cell.ideal, want))
	}
	if r.cut != "" {
		out = append(out, "cut: "+r.cut)
	}
	return out
}

// gated reports whether a client's runs are held to the gates.
func gated(client string) bool { return client == "retryhttp" || client == "retryhttp-pace" }

func sumKinds(kinds map[string]int) int {
	n := 0
	for _, k := range kinds {
		n += k
	}
	return n
}

func kindsString(kinds map[string]int) string {
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, kinds[k]))
	}
	if len(parts) == 0 {
		return "–"
	}
	return strings.Join(parts, ", ")
}

func statusesString(m map[int]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// proxyTable is the markdown table of every run, cell by cell.
func proxyTable(runs []proxyRun) string {
	var b strings.Builder
	b.WriteString("| cell (ideal) | library | pages | req/page backend | req/page proxy | proxy answered | time | × ideal | not got, by kind | host status |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |\n")
	last := ""
	for _, r := range runs {
		cell := ""
		if r.cell.name != last {
			cell = fmt.Sprintf("%s (%.1f s = %s)", r.cell.name, r.cell.ideal.Seconds(), r.cell.why)
			last = r.cell.name
		}
		name := r.client
		if gated(r.client) && len(proxyMisses(r)) > 0 {
			name += " ✗"
		}
		if r.err != nil {
			fmt.Fprintf(&b, "| %s | %s | harness error: %s |||||||\n", cell, name, shorten(r.err.Error(), 120))
			continue
		}
		t := fmt.Sprintf("%.1f s", r.elapsed.Seconds())
		if r.cut != "" {
			t += " (cut)"
		}
		fmt.Fprintf(&b, "| %s | %s | %d / %d | %.2f | %.2f | %s | %s | %.2f | %s | %s |\n",
			cell, name, r.got, r.cell.pages, r.perPageBackend(), r.perPageProxy(),
			statusesString(r.log.byStatus), t, r.ratio(), kindsString(r.kinds), r.hostStatus)
	}
	return b.String()
}
