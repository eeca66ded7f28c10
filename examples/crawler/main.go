// Command crawler fetches pages from many hosts at once through one
// retryhttp Transport, which paces each host on its own (WithPace,
// WithHostPace), retries what failed for a moment, and parks a host that
// asked for a wait, without slowing the others.
//
//	go run ./examples/crawler
//
// The hosts are simulated on loopback: one local server answers for every
// host name, and the crawler's base transport dials it whatever the name,
// so the URLs, the Host headers and the per-host pacing are those of a real
// crawl.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/retryhttp/retryhttp"
	"golang.org/x/time/rate"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "crawler:", err)
		os.Exit(1)
	}
}

// The crawl: pagesPerHost pages from each host. Every host gets the default
// pace; slow.test asked for less in its robots.txt, say.
const pagesPerHost = 6

var (
	hosts = []string{
		"blog.test", "docs.test", "forum.test", "mail.test", "maps.test", "news.test", "shop.test", "wiki.test",
		"busy.test", "limited.test", "slow.test",
	}
	defaultPace = retryhttp.Pace{Limit: 5, Burst: 2}
	hostPaces   = map[string]retryhttp.Pace{"slow.test": {Limit: 2, Burst: 1}}
)

func paceOf(host string) retryhttp.Pace {
	if p, ok := hostPaces[host]; ok {
		return p
	}
	return defaultPace
}

// web answers for every host: most simply serve their pages; busy.test
// answers each page's first request 503; limited.test answers its very
// first request 429 with Retry-After: 1. It logs what each host saw.
type web struct {
	start time.Time
	mu    sync.Mutex
	seen  map[string][]hit // by host
	count map[string]int   // by host and path
}

type hit struct {
	at     time.Duration // since the crawl started
	status int
}

func newWeb() *web {
	return &web{start: time.Now(), seen: make(map[string][]hit), count: make(map[string]int)}
}

func (s *web) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	s.mu.Lock()
	s.count[host+r.URL.Path]++
	n, first := s.count[host+r.URL.Path], len(s.seen[host]) == 0
	status := http.StatusOK
	switch {
	case host == "busy.test" && n == 1:
		status = http.StatusServiceUnavailable
	case host == "limited.test" && first:
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", "1")
	}
	s.seen[host] = append(s.seen[host], hit{time.Since(s.start), status})
	s.mu.Unlock()
	if status != http.StatusOK {
		http.Error(w, http.StatusText(status), status)
		return
	}
	fmt.Fprintf(w, "<html><title>%s%s</title></html>\n", host, r.URL.Path)
}

// Hits returns what host saw, in order.
func (s *web) Hits(host string) []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen[host])
}

// HostStats is the crawl's result for one host.
type HostStats struct {
	Host     string
	Pages    int            // pages fetched with a 200
	Requests int            // requests the host saw, retries included
	Statuses map[int]int    // how many of each status the host sent
	Elapsed  time.Duration  // from the start of the crawl to the host's last page
	Hits     []hit          // what the host saw, in order
	Pace     retryhttp.Pace // the pace it was crawled at
}

// crawl fetches every page of every host through one retryhttp client: a
// worker per host fetches its pages in order, and all the hosts at once.
// The Transport keeps each host to its pace, retries the 503s, and holds
// limited.test's pages back while it is parked; the workers only send.
func crawl(ctx context.Context) ([]HostStats, time.Duration, error) {
	site := newWeb()
	ts := httptest.NewServer(site)
	defer ts.Close()

	// Every host name leads to the local server.
	base := http.DefaultTransport.(*http.Transport).Clone()
	var d net.Dialer
	base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, ts.Listener.Addr().String())
	}
	base.MaxIdleConnsPerHost = 4
	defer base.CloseIdleConnections()

	opts := []retryhttp.Option{
		retryhttp.WithBase(base),
		retryhttp.WithPace(defaultPace.Limit, defaultPace.Burst),
		retryhttp.WithBackoff(100*time.Millisecond, time.Second),
	}
	for h, p := range hostPaces {
		opts = append(opts, retryhttp.WithHostPace(h, p.Limit, p.Burst))
	}
	client := retryhttp.NewClient(opts...)

	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		pages   = make(map[string]int)
		done    = make(map[string]time.Duration)
		failure error
	)
	start := time.Now()
	for _, host := range hosts {
		wg.Go(func() {
			for page := 1; page <= pagesPerHost; page++ {
				url := fmt.Sprintf("http://%s/page/%d", host, page)
				ok, err := fetch(ctx, client, url)
				mu.Lock()
				if err != nil && failure == nil {
					failure = err
				}
				if ok {
					pages[host]++
				}
				done[host] = time.Since(start)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := time.Since(start)
	if failure != nil {
		return nil, total, failure
	}

	stats := make([]HostStats, 0, len(hosts))
	for _, host := range hosts {
		st := HostStats{Host: host, Pages: pages[host], Statuses: make(map[int]int),
			Elapsed: done[host], Hits: site.Hits(host), Pace: paceOf(host)}
		for _, h := range st.Hits {
			st.Requests++
			st.Statuses[h.status]++
		}
		stats = append(stats, st)
	}
	return stats, total, nil
}

// fetch GETs url and reports whether it came back 200.
func fetch(ctx context.Context, client *http.Client, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK, err
}

// run crawls and writes a line per host to w.
func run(w io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stats, total, err := crawl(ctx)
	if err != nil {
		return err
	}
	pages, requests := 0, 0
	for _, st := range stats {
		pages += st.Pages
		requests += st.Requests
	}
	fmt.Fprintf(w, "crawled %d pages from %d hosts with %d requests in %.1f s\n\n",
		pages, len(stats), requests, total.Seconds())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "host\tpace\tpages\trequests\tanswers\telapsed")
	for _, st := range stats {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%.1f s\n",
			st.Host, paceString(st.Pace), st.Pages, st.Requests, statuses(st.Statuses), st.Elapsed.Seconds())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprint(w, "\nbusy.test answers each page's first request 503: retried after a jittered backoff.\n"+
		"limited.test answers its first request 429 with Retry-After: 1: the host is parked for that second.\n"+
		"slow.test has a pace of its own (WithHostPace); the others share the default (WithPace).\n")
	return err
}

func paceString(p retryhttp.Pace) string {
	if p.Limit == rate.Inf {
		return "none"
	}
	return fmt.Sprintf("%g/s, burst %d", float64(p.Limit), p.Burst)
}

// statuses reads like "6×200" or "1×429 6×200".
func statuses(m map[int]int) string {
	codes := make([]int, 0, len(m))
	for c := range m {
		codes = append(codes, c)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(codes)))
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d×%d", m[c], c)
	}
	return strings.Join(parts, " ")
}
