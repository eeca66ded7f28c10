package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/retryhttp/retryhttp"
)

// A proxyRun is one library's run through one cell's proxy.
type proxyRun struct {
	cell        proxyCell
	client      string
	got         int            // pages: a 200 with the page's body
	kinds       map[string]int // the pages not got, by how they ended
	backend     int64          // requests the backends received
	log         proxyLog       // what the proxy logged
	elapsed     time.Duration
	cut         string
	hostStatus  string // retryhttp's HostStatus of the proxy at the end
	err         error  // the harness failed (the proxy did not start, ...)
	proxyErrors string // [emerg]/[alert]/[crit] lines of the proxy's error log
}

func (r proxyRun) perPageProxy() float64 {
	return float64(r.log.requests) / float64(max(r.got, 1))
}

func (r proxyRun) perPageBackend() float64 {
	return float64(r.backend) / float64(max(r.got, 1))
}

func (r proxyRun) ratio() float64 { return r.elapsed.Seconds() / r.cell.ideal.Seconds() }

// newProxyClient is the named library with its defaults: retryhttp is
// retryhttp.New() with nothing else (its own pooled transport); the peers
// are limiters_test.go's constructors over a pooled transport of their own.
// retryhttp-pace is retryhttp.New(WithPace(200, 20)): a pace over what the
// cell can take (100 pages a second), so it never holds a request back.
func newProxyClient(name string) (*http.Client, *retryhttp.Transport) {
	switch name {
	case "retryhttp":
		t := retryhttp.New()
		return &http.Client{Transport: t}, t
	case "retryhttp-pace":
		t := retryhttp.New(retryhttp.WithPace(200, 20))
		return &http.Client{Transport: t}, t
	}
	for _, lc := range limClients {
		if lc.name == name {
			return lc.make(cleanhttp.DefaultPooledTransport()), nil
		}
	}
	panic("no client " + name)
}

// runProxyCell starts the cell's backends and proxy, has the workers fetch
// the pages through the client, and counts.
func runProxyCell(bin, dir string, c proxyCell, client string) (r proxyRun) {
	r = proxyRun{cell: c, client: client, kinds: map[string]int{}}
	var backends []*proxyBackend
	defer func() {
		for _, b := range backends {
			b.close()
		}
	}()
	var upstreams []string
	for _, spec := range c.backends {
		b, err := startBackend(spec)
		if err != nil {
			r.err = err
			return r
		}
		backends = append(backends, b)
		upstreams = append(upstreams, b.addr)
	}
	p, err := startProxy(bin, c, dir, upstreams)
	if err != nil {
		r.err = err
		return r
	}
	defer p.stop()
	url := fmt.Sprintf("http://127.0.0.1:%d", p.port)
	hc, rt := newProxyClient(client)

	ctx, cancel := context.WithTimeout(context.Background(), c.deadline())
	defer cancel()
	var cut atomic.Value
	watchDone := make(chan struct{})
	go func() { // the cap on requests
		defer close(watchDone)
		for ctx.Err() == nil {
			if n := p.lines(); n > c.maxRequests() {
				cut.CompareAndSwap(nil, fmt.Sprintf("more than %d requests", c.maxRequests()))
				cancel()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	var (
		next atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range c.workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				page := next.Add(1)
				if page > int64(c.pages) {
					return
				}
				kind := fetchPage(ctx, hc, url, page)
				mu.Lock()
				if kind == "" {
					r.got++
				} else {
					r.kinds[kind]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	if taken := r.got + sumKinds(r.kinds); taken < c.pages {
		r.kinds["not tried"] += c.pages - taken // no worker took them before the deadline
	}
	if s, ok := cut.Load().(string); ok {
		r.cut = s
	} else if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.cut = fmt.Sprintf("the run's deadline (%v)", c.deadline())
	}
	cancel()
	<-watchDone
	if rt != nil {
		if s, err := rt.HostStatus(context.Background(), fmt.Sprintf("127.0.0.1:%d", p.port)); err == nil {
			r.hostStatus = describeHostStatus(s)
		}
	}
	hc.CloseIdleConnections()
	// The proxy logs a request as it ends: wait for the log to settle.
	for n, i := -1, 0; i < 20; i++ {
		time.Sleep(50 * time.Millisecond)
		m := p.lines()
		if m == n {
			break
		}
		n = m
	}
	p.stop()
	r.log = p.readLog()
	for _, b := range backends {
		r.backend += b.requests.Load()
	}
	if d, err := os.ReadFile(filepath.Join(dir, "error.log")); err == nil {
		for line := range strings.SplitSeq(string(d), "\n") {
			if strings.Contains(line, "[emerg]") || strings.Contains(line, "[alert]") || strings.Contains(line, "[crit]") {
				r.proxyErrors += line + "\n"
			}
		}
	}
	return r
}

// fetchPage GETs one page through hc: "" when it got the page, else how
// it ended.
func fetchPage(ctx context.Context, hc *http.Client, url string, page int64) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/page/%d", url, page), nil)
	if err != nil {
		panic(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, retryhttp.ErrHostDown) && !errors.Is(err, retryhttp.ErrHostPaused) {
			return "run deadline"
		}
		return errKind(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return errKind(err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Sprintf("%d back", resp.StatusCode)
	case string(body) != "page "+strconv.FormatInt(page, 10):
		return "wrong body"
	}
	return ""
}

// errKind names an error by what it is, not its text.
func errKind(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, retryhttp.ErrHostDown):
		return "ErrHostDown"
	case errors.Is(err, retryhttp.ErrHostPaused):
		return "ErrHostPaused"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "run deadline"
	case strings.Contains(msg, "giving up after"):
		return "gave up" // go-retryablehttp
	case strings.Contains(msg, "retries exceeded"):
		return "retries exceeded" // failsafe-go
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "reset"
	}
	return shorten(msg, 60)
}

func describeHostStatus(s retryhttp.HostStatus) string {
	out := s.State.String()
	if !s.Pace.Unlimited() {
		out += fmt.Sprintf(" pace %.3g/s", float64(s.Pace.Limit))
	}
	if s.InFlight > 0 {
		out += fmt.Sprintf(" in-flight %d", s.InFlight)
	}
	return out
}
