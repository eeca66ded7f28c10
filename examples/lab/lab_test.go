package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/retryhttp/retryhttp"
)

// The lab's figures are deterministic, so the retryhttp figures are checked
// exactly: a change in them is a change in the library's behaviour, to be
// looked at and then copied here. Times are checked as the table prints
// them. The naive figures are checked against the seeds.

type want struct {
	requests, refused, served int
	done                      string // as secs or short prints it
}

func check(t *testing.T, name string, got Outcome, w want, format func(time.Duration) string) {
	t.Helper()
	if got.Requests != w.requests || got.Refused != w.refused || got.Served != w.served || format(got.Done) != w.done {
		t.Errorf("%s: %d sent, %d refused, %d served, done at %s; want %d, %d, %d, %s",
			name, got.Requests, got.Refused, got.Served, format(got.Done),
			w.requests, w.refused, w.served, w.done)
	}
}

func TestPages(t *testing.T) {
	check(t, "naive, ask again at once", PagesNaive(false), want{301, 281, 20, "15.1 s"}, secs)
	check(t, "naive, obey Retry-After", PagesNaive(true), want{34, 14, 20, "15.7 s"}, secs)
	// Unpaced but learning from the 429s: fewer refused than obeying alone.
	check(t, "retryhttp, unpaced", PagesRetryhttp(false), want{24, 4, 20, "15.5 s"}, secs)
	paced := PagesRetryhttp(true)
	check(t, "retryhttp, WithPace(0.9, 3)", paced, want{20, 0, 20, "18.9 s"}, secs)
	if paced.Done > 19*time.Second {
		t.Errorf("paced run done at %v, want by 18.9 s", paced.Done)
	}
}

func TestBoard(t *testing.T) {
	check(t, "naive, local clock", BoardNaive(), want{41, 40, 1, "91.0 s"}, secs)
	check(t, "retryhttp, Date header", BoardRetryhttp(boardOptions...), want{2, 1, 1, "90.1 s"}, secs)
	// With the default max of 60 s, the 90 s wait is not slept through.
	check(t, "retryhttp, defaults", BoardRetryhttp(), want{1, 1, 0, "0.1 s"}, secs)
}

func TestCollectors(t *testing.T) {
	fixed := CollectorsNaive(Fixed)
	check(t, "naive, fixed 1 s", fixed, want{275, 225, 50, "9.5 s"}, secs)
	exp := CollectorsNaive(Exponential)
	check(t, "naive, exponential", exp, want{275, 225, 50, "180.5 s"}, secs)
	for _, o := range []Outcome{fixed, exp} {
		if o.Burst != 45 {
			t.Errorf("naive burst %d, want waves of 45", o.Burst)
		}
	}

	jitter := CollectorsRetryhttp(collectorsOptions...)
	check(t, "retryhttp, default backoff", jitter, want{96, 46, 50, "10.1 s"}, secs)
	seedish := CollectorsRetryhttp(collectorsSeedOptions...)
	check(t, "retryhttp, WithBackoff(2s, 30s)", seedish, want{99, 49, 50, "11.8 s"}, secs)
	for _, o := range []Outcome{jitter, seedish} {
		if o.Requests >= fixed.Requests {
			t.Errorf("full jitter sent %d, want fewer than fixed's %d", o.Requests, fixed.Requests)
		}
		if o.Burst > 2 {
			t.Errorf("full jitter's largest burst is %d, want no waves", o.Burst)
		}
	}
	if seedish.Done >= exp.Done/4 {
		t.Errorf("full jitter served all at %v, want far sooner than exponential's %v", seedish.Done, exp.Done)
	}
}

func TestOutage(t *testing.T) {
	check(t, "naive", OutageNaive(), want{300, 300, 0, "215.0 s"}, secs)
	// The budget alone (learning off): 10 % of first tries, 110 for 100
	// pages; none without a budget to hold it.
	off := retryhttp.WithLearning(false)
	if got := OutageRetryhttp(nil, off).Requests; got != 300 {
		t.Errorf("retryhttp without budget or learning sent %d, want 300", got)
	}
	check(t, "retryhttp, NewBudget(0.1, 0), learning off", OutageRetryhttp(retryhttp.NewBudget(0.1, 0), off), want{110, 110, 0, "8.6 s"}, secs)
	// The host model: down after a run of failures (10, for a host that
	// failed from its first answer: it might be a flaky one), the rest of
	// the pages handed back at once with ErrHostDown, whatever the budget.
	for _, b := range []*retryhttp.Budget{nil, retryhttp.NewBudget(0.1, 0), retryhttp.NewBudget(0.1, 1)} {
		got := OutageRetryhttp(b)
		if got.Requests > 12 || got.Requests+got.Unsent < pages || got.Done > 4*time.Second {
			t.Errorf("retryhttp, budget %v: %d sent, %d handed back at once, done at %v; want at most 12 sent, the rest handed back, within 4 s",
				b != nil, got.Requests, got.Unsent, got.Done)
		}
	}
	check(t, "retryhttp, defaults", OutageRetryhttp(retryhttp.NewBudget(0.1, 1)), want{10, 10, 0, "3.3 s"}, secs)
}

func TestRetryAfterZero(t *testing.T) {
	check(t, "naive", ForbiddenNaive(), want{5, 5, 0, "5 ms"}, short)
	floored := ForbiddenRetryhttp()
	check(t, "retryhttp", floored, want{5, 5, 0, "4.005 s"}, short)
	if floored.Done <= 4*time.Second {
		t.Errorf("five tries took %v, want over 4 s", floored.Done)
	}
}

func TestRetryAfterADay(t *testing.T) {
	naive := BlipNaive()
	check(t, "naive", naive, want{2, 1, 1, "24.0 h"}, short)
	parked := BlipRetryhttp()
	check(t, "retryhttp", parked, want{1, 1, 0, "1 ms"}, short)
	var paused *retryhttp.HostPausedError
	if !errors.Is(parked.Second, retryhttp.ErrHostPaused) || !errors.As(parked.Second, &paused) {
		t.Fatalf("second request: %v, want ErrHostPaused", parked.Second)
	}
	if want := epoch.Add(time.Millisecond).Add(retryhttp.MaxParking); !paused.Until.Equal(want) {
		t.Errorf("parked until %v, want %v (MaxParking after the answer)", paused.Until, want)
	}
}

func TestQuota(t *testing.T) {
	check(t, "naive, sleep Retry-After", QuotaNaive(), want{540, 390, 150, "14.9 s"}, secs)

	// Defaults: held to the announced quota from the first answer, only
	// the first burst of 30 is refused (all 150, at most 170, by 17 s).
	// The first reset costs one round trip: until an answer says the
	// window is whole again (fixed), it grants one, then its average rate.
	check(t, "retryhttp, defaults", QuotaRetryhttp(), want{170, 20, 150, "15.2 s"}, secs)
}

func TestRising(t *testing.T) {
	naive := RisingNaive()
	check(t, "naive, fixed 1 s", naive, want{2170, 1370, 800, "30.2 s"}, secs)
	if naive.Caught != 10*time.Second {
		t.Errorf("naive: %d served a second from %v, want from 10s", risingServed, naive.Caught)
	}

	// The pace follows the capacity up within a few seconds of the rise.
	got := RisingRetryhttp(risingOptions...)
	check(t, "retryhttp", got, want{901, 101, 800, "30.8 s"}, secs)
	if got.Caught != 13*time.Second {
		t.Errorf("retryhttp: %d served a second from %v, want from 13s", risingServed, got.Caught)
	}
}

// TestQuotaHost checks the headers of the quota host: what is left of the
// window, whole seconds to its end rounded up, and refusals that do not
// count.
func TestQuotaHost(t *testing.T) {
	w := newWorld()
	w.addQuota()
	client := w.naiveClient()
	type answer struct {
		status                  int
		remaining, reset, after string
	}
	var got []answer
	ask := func() {
		status, h := mustGet(client, quotaURL(1))
		if h.Get("X-RateLimit-Limit") != "10" {
			t.Errorf("X-RateLimit-Limit %q, want 10", h.Get("X-RateLimit-Limit"))
		}
		got = append(got, answer{status, h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"), h.Get("Retry-After")})
	}
	w.clock.Run(func() {
		for range 11 { // 0 s to 0.55 s
			ask()
		}
		w.sleep(900 * time.Millisecond) // 1.45 s: a new window
		ask()
	})
	for i, a := range got {
		want := answer{200, fmt.Sprint(9 - i), "1", ""}
		switch i {
		case 10:
			want = answer{429, "0", "1", "1"}
		case 11:
			want = answer{200, "9", "1", ""}
		}
		if a != want {
			t.Errorf("answer %d: %+v, want %+v", i+1, a, want)
		}
	}

	// Reset rounds up: 0.3 s before the end of the window is 1, and a
	// longer window would say more.
	w = newWorld()
	host := &Quota{clock: w.clock, Limit: 1}
	w.net.Add(quotaHost, shopLatency, host)
	w.clock.Run(func() {
		w.sleep(2700 * time.Millisecond)
		_, h := mustGet(w.naiveClient(), quotaURL(1))
		if h.Get("X-RateLimit-Reset") != "1" || h.Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("at 2.7 s: Reset %q, Remaining %q; want 1, 0", h.Get("X-RateLimit-Reset"), h.Get("X-RateLimit-Remaining"))
		}
	})
}

// TestRisingHost checks that the stock host's capacity rises at After.
func TestRisingHost(t *testing.T) {
	w := newWorld()
	host := w.addRising()
	client := w.naiveClient()
	w.clock.Run(func() {
		w.sleep(9 * time.Second)
		for range 45 {
			mustGet(client, stockURL(1)) // 9.0 s to 9.95 s... and on past 10 s
		}
	})
	// 9.00 to 9.95 s: 20 requests, 5 served; 10.00 to 11.20 s: 25, all served.
	if got := host.Log.Count(http.StatusOK); got != 30 {
		t.Errorf("%d served, want 30", got)
	}
	if at, ok := host.Log.FirstBusySecond(risingAfter, http.StatusOK, 20); !ok || at != 10*time.Second {
		t.Errorf("20 served in second %v (%v), want 10s", at, ok)
	}
}

func TestCharts(t *testing.T) {
	if got := sparkline([]int{0, 1, 4, 8, 3}, 8); got != " ▁▄█▃" {
		t.Errorf("sparkline = %q", got)
	}
	for _, c := range []struct {
		last   time.Duration
		bucket time.Duration
		n      int
	}{
		{0, time.Second, 1},
		{59*time.Second + 999*time.Millisecond, time.Second, 60},
		{60 * time.Second, 2 * time.Second, 31},
		{180*time.Second + 500*time.Millisecond, 5 * time.Second, 37},
		{24*time.Hour + time.Millisecond, 30 * time.Minute, 49},
	} {
		if b, n := bucketFor(c.last, chartWidth); b != c.bucket || n != c.n {
			t.Errorf("bucketFor(%v) = %v, %d; want %v, %d", c.last, b, n, c.bucket, c.n)
		}
	}
	if got := axis(time.Second, 25); got != "0         10        20 s" {
		t.Errorf("axis = %q", got)
	}
	if got := axis(30*time.Minute, 49); got != "0         5h        10h       15h       20h" {
		t.Errorf("axis = %q", got)
	}

	var out bytes.Buffer
	rows := labRows()
	if err := WriteCharts(&out, rows); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		if !strings.Contains(out.String(), fmt.Sprintf("\n%2d. %s  [█ = ", i+1, r.Scenario)) {
			t.Errorf("no chart for row %d", i+1)
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if bar := strings.Index(line, "│"); bar >= 0 {
			if n := utf8.RuneCountInString(strings.Split(line, "│")[1]); n > chartWidth {
				t.Errorf("chart line of %d characters, want at most %d: %s", n, chartWidth, line)
			}
		}
	}
}

func TestSVGs(t *testing.T) {
	dir := t.TempDir()
	written, err := WriteSVGs(dir, labRows())
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range []string{"lab-collectors.svg", "lab-quota.svg", "lab-outage.svg", "lab-slots.svg"} {
		want = append(want, filepath.Join(dir, f))
	}
	if !slices.Equal(written, want) {
		t.Fatalf("wrote %v, want %v", written, want)
	}
	for _, path := range written {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(bytes.NewReader(data))
		for {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s is not well-formed: %v", path, err)
			}
		}
		for _, s := range []string{"naive loop", "retryhttp", "requests/s", ">s (since", "<rect", "stroke-dasharray"} {
			if !bytes.Contains(data, []byte(s)) {
				t.Errorf("%s lacks %q", path, s)
			}
		}
	}
	// The outage's chart shades the outage, and names it.
	data, err := os.ReadFile(filepath.Join(dir, "lab-outage.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`fill="` + shadeColour + `"`, "the outage: 503 to everything, 5 s to 15 s"} {
		if !bytes.Contains(data, []byte(s)) {
			t.Errorf("lab-outage.svg lacks %q", s)
		}
	}
}

// labRows is one run of every scenario, shared by the tests that only read
// the rows: under the race detector a run takes seconds. The determinism
// test compares it with a run of its own.
var labRows = sync.OnceValue(Rows)

func TestRunIsDeterministic(t *testing.T) {
	var first, second bytes.Buffer
	if err := report(&first, labRows()); err != nil {
		t.Fatal(err)
	}
	if err := run(&second); err != nil {
		t.Fatal(err)
	}
	if first.String() != second.String() {
		t.Fatalf("two runs differ:\n%s\n---\n%s", first.String(), second.String())
	}
	out := first.String()
	if n := strings.Count(out, "\n| #"); n != 1 {
		t.Errorf("%d table headers, want one table", n)
	}
	if n := strings.Count(out, "\n| ") - 2; n != 13 {
		t.Errorf("%d table rows, want 13", n)
	}
	for _, s := range []string{"301 sent, 281 refused", "20 sent, 0 refused, done at 18.9 s", "ErrHostPaused"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}
