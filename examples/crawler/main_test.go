package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestCrawl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stats, total, err := crawl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != len(hosts) {
		t.Fatalf("%d hosts crawled, want %d", len(stats), len(hosts))
	}
	for _, st := range stats {
		if st.Pages != pagesPerHost {
			t.Errorf("%s: %d pages, want %d", st.Host, st.Pages, pagesPerHost)
		}
		wantRequests, refusal := pagesPerHost, 0
		switch st.Host {
		case "busy.test":
			wantRequests, refusal = 2*pagesPerHost, http.StatusServiceUnavailable
		case "limited.test":
			wantRequests, refusal = pagesPerHost+1, http.StatusTooManyRequests
		}
		if st.Requests != wantRequests || st.Statuses[http.StatusOK] != pagesPerHost ||
			(refusal != 0 && st.Statuses[refusal] != wantRequests-pagesPerHost) {
			t.Errorf("%s: %d requests, answers %v; want %d", st.Host, st.Requests, st.Statuses, wantRequests)
		}

		// The pace is a floor on the time the host's requests span: after
		// the burst, one request every 1/rate seconds, retries included.
		first, last := st.Hits[0].at, st.Hits[len(st.Hits)-1].at
		floor := time.Duration(float64(st.Requests-st.Pace.Burst) / float64(st.Pace.Limit) * float64(time.Second))
		if last-first < floor-50*time.Millisecond {
			t.Errorf("%s: %d requests over %v, want at least %v at %v/s, burst %d",
				st.Host, st.Requests, last-first, floor, st.Pace.Limit, st.Pace.Burst)
		}
	}

	// Nothing reached limited.test in the second it asked for.
	for _, st := range stats {
		if st.Host != "limited.test" {
			continue
		}
		if st.Hits[0].status != http.StatusTooManyRequests {
			t.Fatalf("limited.test's first answer was %d", st.Hits[0].status)
		}
		if gap := st.Hits[1].at - st.Hits[0].at; gap < 990*time.Millisecond {
			t.Errorf("limited.test got a request %v after its 429 with Retry-After: 1", gap)
		}
	}
	if total > 20*time.Second {
		t.Errorf("the crawl took %v", total)
	}
}

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"crawled 66 pages from 11 hosts with 73 requests in ",
		"host          pace          pages  requests  answers      elapsed\n",
		"slow.test     2/s, burst 1  6      6         6×200",
		"busy.test     5/s, burst 2  6      12        6×503 6×200",
		"limited.test  5/s, burst 2  6      7         1×429 6×200",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q; it is:\n%s", want, got)
		}
	}
}
