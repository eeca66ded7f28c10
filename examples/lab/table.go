package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/retryhttp/retryhttp"
)

// Row is one line of the lab's table, and the note that says how it was run.
type Row struct {
	Scenario, Naive, Retry, Seed string
	How                          string

	// NaiveAt and RetryAt are when each request of the naive run and of the
	// retryhttp run reached the host: the row's chart.
	NaiveAt, RetryAt []time.Duration
	// SVG, if not empty, is the name of the file the row's chart is also
	// drawn into with -svg, and Capacity what the host serves a second, for
	// a line across it (0: no line); CapacityLabel names that line.
	SVG           string
	Capacity      float64
	CapacityLabel string
	// Shade, if its end is not zero, is a span of the run the SVG chart
	// shades, and ShadeLabel names it in the legend.
	Shade      [2]time.Duration
	ShadeLabel string
}

// arrivals fills in the row's chart from its two runs.
func (r Row) arrivals(naive, retry Outcome) Row {
	r.NaiveAt, r.RetryAt = naive.Arrivals, retry.Arrivals
	return r
}

// Rows runs every scenario and returns the table's rows.
func Rows() []Row {
	var rows []Row

	atOnce, paced := PagesNaive(false), PagesRetryhttp(true)
	rows = append(rows, Row{
		Scenario: "20 pages, host allows 5 at once then 1/s",
		Naive:    sent(atOnce) + ", " + doneAt(atOnce),
		Retry:    sent(paced) + ", " + doneAt(paced),
		Seed:     "301 (281 refused) → 20, 0 refused, 18.9 s",
		How: "naive asks again at once after each 429; retryhttp paces itself below the host: " +
			"WithPace(0.9, 3), WithMaxAttempts(50), WithBudget(nil). Without WithPace, learning from the " +
			"429s gives row 2's figure.",
	}.arrivals(atOnce, paced))

	obey, obeyRH := PagesNaive(true), PagesRetryhttp(false)
	rows = append(rows, Row{
		Scenario: "the same 20 pages, obeying Retry-After",
		Naive:    sent(obey) + ", " + doneAt(obey),
		Retry:    sent(obeyRH) + ", " + doneAt(obeyRH),
		Seed:     "34 (14 refused), 15.7 s",
		How: "naive sleeps the 429's Retry-After; retryhttp, unpaced, obeys it by itself " +
			"(1 s floor, host parked meanwhile): WithMaxAttempts(50), WithBudget(nil).",
	}.arrivals(obey, obeyRH))

	board, boardRH := BoardNaive(), BoardRetryhttp(boardOptions...)
	rows = append(rows, Row{
		Scenario: "board closed 90 s, Retry-After a date, server clock 40 s behind",
		Naive:    fmt.Sprintf("%d sent, open at %s", board.Requests, secs(board.Done)),
		Retry:    fmt.Sprintf("%d sent, open at %s", boardRH.Requests, secs(boardRH.Done)),
		Seed:     "41, open at 91.0 s → 2, open at 90.1 s",
		How: "naive counts the date from its own clock, at least 1 s; retryhttp counts it from the answer's " +
			"Date header: WithRetryAfterLimits(1s, 2m), since 90 s is over the default max of 60 s " +
			"(with the default it returns the 503 at once and parks the host).",
	}.arrivals(board, boardRH))

	fixed, jitter := CollectorsNaive(Fixed), CollectorsRetryhttp(collectorsOptions...)
	rows = append(rows, Row{
		Scenario: "50 collectors, host serves 5/s, 503 without Retry-After",
		Naive:    served(fixed),
		Retry:    served(jitter),
		Seed:     "275, 9.5 s → full jitter 168, 19.5 s",
		How: "naive waits 1 s after each 503; retryhttp uses its default backoff, full jitter with base " +
			"500 ms and max 30 s, one Transport for the 50: WithMaxAttempts(20), WithBudget(nil). " +
			"A burst is the most requests that reached the host at one instant after the start.",
		SVG:           "lab-collectors.svg",
		Capacity:      5,
		CapacityLabel: "what the host serves: 5 requests/s, 503 to the rest",
	}.arrivals(fixed, jitter))

	exp, jitter2 := CollectorsNaive(Exponential), CollectorsRetryhttp(collectorsSeedOptions...)
	rows = append(rows, Row{
		Scenario: "the same, with the field note's base 2 s and cap 30 s",
		Naive:    served(exp),
		Retry:    served(jitter2),
		Seed:     "275 in waves, 180.5 s → 168, 19.5 s",
		How: "naive waits 2, 4, 8, 16, 30, 30 ... s, no jitter; retryhttp draws each wait from " +
			"the same windows: WithBackoff(2s, 30s), WithMaxAttempts(20), WithBudget(nil).",
	}.arrivals(exp, jitter2))

	outage, down := OutageNaive(), OutageRetryhttp(retryhttp.NewBudget(0.1, 1))
	off := retryhttp.WithLearning(false)
	budgeted, unbudgeted := OutageRetryhttp(retryhttp.NewBudget(0.1, 0), off), OutageRetryhttp(nil, off)
	rows = append(rows, Row{
		Scenario: "outage: 100 pages, 503 to everything, 3 tries each",
		Naive:    fmt.Sprintf("%d sent", outage.Requests),
		Retry:    fmt.Sprintf("%d sent, %d handed back at once (host down)", down.Requests, down.Unsent),
		Seed:     "300 → with a 10 % budget, 110",
		How: fmt.Sprintf("naive tries each page 3 times, 1 s apart; retryhttp with its defaults finds the host "+
			"down after a run of failures and hands the rest back at once with ErrHostDown, trying the host "+
			"again twice a second. With WithLearning(false) the budget alone holds it: NewBudget(0.1, 0) "+
			"sends %d, no budget %d.", budgeted.Requests, unbudgeted.Requests),
	}.arrivals(outage, down))

	zero, floored := ForbiddenNaive(), ForbiddenRetryhttp()
	rows = append(rows, Row{
		Scenario: "403 with Retry-After: 0, 5 tries (note 000)",
		Naive:    fmt.Sprintf("%d sent in %s", zero.Requests, short(zero.Done)),
		Retry:    fmt.Sprintf("%d sent in %s", floored.Requests, short(floored.Done)),
		Seed:     "5 in 1.3-15 ms → with a 1 s floor, 5 in 5.025 s",
		How: "naive sleeps whatever Retry-After says; retryhttp: WithRetryStatuses(403), " +
			"WithMaxAttempts(5), and its default 1 s floor. The stub is on loopback: 1 ms a request.",
	}.arrivals(zero, floored))

	day, parked := BlipNaive(), BlipRetryhttp()
	rows = append(rows, Row{
		Scenario: "503 with Retry-After: 86400 (note 000)",
		Naive:    fmt.Sprintf("%d sent, done after %s", day.Requests, short(day.Done)),
		Retry:    fmt.Sprintf("%d sent, 503 back in %s; next: %s", parked.Requests, short(parked.Done), pausedOrNot(parked.Second)),
		Seed:     "a worker that sleeps for a day",
		How: "naive sleeps whatever Retry-After says (the 503s last 5 s); retryhttp, defaults: " +
			"86400 s is over the 60 s max, so it returns the 503 at once and parks the host " +
			"(for MaxParking, 1 h, at most), and the next request fails fast.",
	}.arrivals(day, parked))

	quota, quotaRH := QuotaNaive(), QuotaRetryhttp()
	rows = append(rows, Row{
		Scenario: "a host that announces its quota (10 per 1 s window), 30 workers, 150 pages",
		Naive:    pagesServed(quota, quotaPages),
		Retry:    pagesServed(quotaRH, quotaPages),
		Seed:     "(no note)",
		How: "the host counts a fixed window of 10 requests a second and says so on every answer " +
			"(X-RateLimit-Limit, -Remaining, -Reset); the 11th and later in a window get 429 with " +
			"Retry-After: 1. 30 workers take the pages from a shared queue. Naive sleeps the " +
			"Retry-After and asks again until served; retryhttp, one GET a page through one Transport, " +
			"all defaults (3 tries, the default budget): it paces at the announced rate from the first " +
			"answer, so only the first burst is refused. \"last at\" is when the last page served came back.",
		SVG:           "lab-quota.svg",
		Capacity:      quotaLimit,
		CapacityLabel: "the quota: 10 requests per 1 s window, 429 to the rest",
	}.arrivals(quota, quotaRH))

	rising, risingRH := RisingNaive(), RisingRetryhttp(risingOptions...)
	rows = append(rows, Row{
		Scenario: "a host whose capacity changes mid-run (5/s, then 40/s), 50 workers, 800 items",
		Naive:    risen(rising),
		Retry:    risen(risingRH),
		Seed:     "(no note)",
		How: fmt.Sprintf("the host serves 5 requests a second for the first 10 s, 40 a second "+
			"afterwards, and answers the rest 503 without Retry-After. 50 workers take the items "+
			"from a shared queue. Naive asks again 1 s after each 503; retryhttp, one GET an item: "+
			"WithMaxAttempts(20), WithBudget(nil). \"≥ %d served/s from\" is the first whole second from "+
			"the rise on in which the host served %d or more: how soon the pace follows the capacity up.",
			risingServed, risingServed),
	}.arrivals(rising, risingRH))
	return append(rows, replicaRow(), restartRow(), slotsRow())
}

// replicaRow is the broken replica's row: a failing host, retried at full
// speed.
func replicaRow() Row {
	naive, rh := ReplicasNaive(), ReplicasRetryhttp()
	off := ReplicasRetryhttp(retryhttp.WithLearning(false))
	return Row{
		Scenario: "a broken replica: 1 request in 5 answered 503 at once, 30 workers, 600 pages",
		Naive:    pagesServed(naive, replicaPages),
		Retry:    pagesServed(rh, replicaPages) + "; " + held(rh.Seen),
		Seed:     "(no note)",
		How: fmt.Sprintf("a balancer hands requests to 5 replicas in turn; the fifth answers 503 at once (5 ms), "+
			"without Retry-After, the others serve a page in 50 ms. 30 workers take the pages from a shared queue. "+
			"Naive tries each page 3 times, asking again at once: failsafe-go's failsafehttp retry policy by "+
			"default (2 retries, no delay without a Retry-After), the fastest a loop can be against a host whose "+
			"failures load does not explain. retryhttp, one GET a page through one Transport, all defaults: "+
			"it takes the host for failing, not overloaded, and never paces it; its time is its backoff's (full "+
			"jitter, 0-0.5 s then 0-1 s); with WithLearning(false), %s. \"seen\" is what HostStatus said "+
			"after every page.",
			pagesServed(off, replicaPages)),
	}.arrivals(naive, rh)
}

// restartRow is the outage with a recovery: a down host handed back, then
// served again.
func restartRow() Row {
	naive, rh := RestartNaive(), RestartRetryhttp()
	return Row{
		Scenario: "outage and return: 100 requests/s open-loop, 503 to all from 5 s to 15 s",
		Naive:    recovered(naive),
		Retry:    recovered(rh),
		Seed:     "(no note)",
		How: fmt.Sprintf("a request starts every 10 ms, whatever became of those before (each its own caller, "+
			"25 s of them, 2500 in all); the host serves in 50 ms, but answers 503 to everything, without "+
			"Retry-After, from 5 s to 15 s. Naive tries each 3 times, 1 s apart, as in row 6. retryhttp, one "+
			"GET a request through one Transport, all defaults: the outage's first 503s look like overload to "+
			"it, so it paces the host until it holds it down; from then on a request is handed back with "+
			"ErrHostDown (at once, or, for %d that were waiting for the pace or a backoff, after up to %s), and "+
			"the host is probed twice a second. After the return it is paced at what it took before the outage "+
			"(the pace cut as the outage began is not kept), and the pace grows while it binds. \"in the second after\" counts the requests served "+
			"from 15 s to 16 s, \"busiest second\" the most the host got in a second from 15 s on, \"longest "+
			"call\" the longest a caller waited for its answer.",
			rh.Unsent-rh.AtOnce, short(rh.LongestUnsent)),
		SVG:           "lab-outage.svg",
		Capacity:      float64(time.Second / restartEvery),
		CapacityLabel: "what the callers ask: 100 requests/s, all served while the host is up",
		Shade:         [2]time.Duration{restartDown, restartUp},
		ShadeLabel:    "the outage: 503 to everything, 5 s to 15 s",
		NaiveAt:       naive.Arrivals,
		RetryAt:       rh.Arrivals,
	}
}

// slotsRow is the host that limits what it serves at once: overloaded, held
// to a limit in flight.
func slotsRow() Row {
	naive, rh := SlotsNaive(), SlotsRetryhttp()
	return Row{
		Scenario: "a host that serves 10 at a time (100 ms each), 503 beyond, 30 workers, 600 pages",
		Naive:    pagesServed(naive, slotsPages),
		Retry:    pagesServed(rh, slotsPages) + "; " + held(rh.Seen),
		Seed:     "(no note)",
		How: fmt.Sprintf("the host has 10 workers and no queue: a page takes 100 ms, a request beyond the 10 "+
			"gets 503 at once (5 ms), without Retry-After, so it serves 100 a second and 600 pages take 6 s at "+
			"best. 30 workers take the pages from a shared queue. Naive asks again 1 s after each 503, as in "+
			"rows 4 and 10 (asking again at once, it sends %d requests for the 600 pages). retryhttp, one GET a "+
			"page through one Transport, all defaults: the first 30 meet the 10 slots, and it paces the host "+
			"for a second; then it holds it to a limit in flight, %s at first, one more for every limit's "+
			"worth of pages served, up to what the host takes at once.",
			SlotsAtOnce().Requests, limitsFrom(rh.Seen)),
		SVG:           "lab-slots.svg",
		Capacity:      float64(slotsSize) * float64(time.Second/slotsWork),
		CapacityLabel: "what the host serves: 10 at a time, 100 ms each, 100 requests/s",
	}.arrivals(naive, rh)
}

// WriteTable writes rows as one Markdown table, its columns aligned, and
// then the note of each row.
func WriteTable(w io.Writer, rows []Row) error {
	header := []string{"#", "scenario", "naive loop", "retryhttp", "the field note's figure"}
	cells := [][]string{header}
	for i, r := range rows {
		cells = append(cells, []string{fmt.Sprint(i + 1), r.Scenario, r.Naive, r.Retry, r.Seed})
	}
	width := make([]int, len(header))
	for _, line := range cells {
		for i, c := range line {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for n, line := range cells {
		writeLine(&b, line, width)
		if n == 0 {
			rule := make([]string, len(width))
			for i, wd := range width {
				rule[i] = strings.Repeat("-", wd)
			}
			writeLine(&b, rule, width)
		}
	}
	b.WriteString("\nHow each row is run:\n")
	for i, r := range rows {
		fmt.Fprintf(&b, "%d. %s\n", i+1, r.How)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeLine(b *strings.Builder, cells []string, width []int) {
	for i, c := range cells {
		b.WriteString("| ")
		b.WriteString(c)
		b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)+1))
	}
	b.WriteString("|\n")
}

func sent(o Outcome) string { return fmt.Sprintf("%d sent, %d refused", o.Requests, o.Refused) }

func doneAt(o Outcome) string { return "done at " + secs(o.Done) }

func served(o Outcome) string {
	all := "all served"
	if o.Served != collectors {
		all = fmt.Sprintf("%d of %d served", o.Served, collectors)
	}
	return fmt.Sprintf("%d sent, bursts of %d, %s at %s", o.Requests, o.Burst, all, secs(o.Done))
}

// secs is a duration in seconds with one decimal, as the seed prints them.
// pagesServed is the quota row's cell: pages out of total, and when the
// last came back.
func pagesServed(o Outcome, total int) string {
	return fmt.Sprintf("%s, %d of %d pages, last at %s", sent(o), o.Served, total, secs(o.Done))
}

// risen is the rising-capacity row's cell.
func risen(o Outcome) string {
	followed := fmt.Sprintf("≥ %d served/s from %s", risingServed, whole(o.Caught))
	if o.Caught < 0 {
		followed = fmt.Sprintf("never %d served/s", risingServed)
	}
	return fmt.Sprintf("%s, %d of %d served at %s, %s", sent(o), o.Served, risingItems, secs(o.Done), followed)
}

// held says how retryhttp held the host: the states it went through, and
// the limit in flight it ended with, or that it was never paced.
func held(s Seen) string {
	names := make([]string, len(s.States))
	for i, st := range s.States {
		names[i] = st.String()
	}
	out := "seen " + strings.Join(names, ", then ")
	switch {
	case len(s.Limits) > 0:
		out += fmt.Sprintf(", held to %d in flight", s.Limits[len(s.Limits)-1])
	case !s.Paced:
		out += ", never paced"
	}
	return out
}

// limitsFrom is the first limit in flight retryhttp held the host to.
func limitsFrom(s Seen) string {
	if len(s.Limits) == 0 {
		return "none"
	}
	return fmt.Sprint(s.Limits[0])
}

// recovered is the outage-and-return row's cell.
func recovered(r Recovery) string {
	back := "none handed back"
	if r.Unsent > 0 {
		back = fmt.Sprintf("%d handed back unsent, %d of them at once", r.Unsent, r.AtOnce)
	}
	return fmt.Sprintf("%d sent during the outage, %s; %d served in the second after, busiest second %d; "+
		"longest call %s", r.During, back, r.Next, r.Busiest, secs(r.Longest))
}

// whole is a whole number of seconds.
func whole(d time.Duration) string { return fmt.Sprintf("%d s", int(d/time.Second)) }

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// short is a duration to the millisecond, in the unit that reads best.
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Hour:
		return fmt.Sprintf("%.3f s", d.Seconds())
	default:
		return fmt.Sprintf("%.1f h", d.Hours())
	}
}

func pausedOrNot(err error) string {
	if errors.Is(err, retryhttp.ErrHostPaused) {
		return "ErrHostPaused"
	}
	return fmt.Sprint("not paused: ", err)
}
