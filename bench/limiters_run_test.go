package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// limResult is what one run counted.
type limResult struct {
	middleware, client string
	cell               limCell
	floor              int           // the fewest requests the cell allows (floorRequests)
	fetched            int           // pages whose final answer was a 200
	statusBack         int           // pages whose final answer was another status (a 429 handed back)
	errs               int           // pages whose request ended in an error
	firstErr           string        // the first such error
	requests           int64         // requests the server received, refused ones included
	refused            int64         // of which the middleware answered 429
	elapsed            time.Duration // first request to the last worker done
	cut                string        // why the run was cut short, if it was
	seen               *limHeaders   // what the middleware said
}

// perPage is the requests the server received per page fetched (all of
// them, if nothing was fetched).
func (r limResult) perPage() float64 {
	return float64(r.requests) / float64(max(r.fetched, 1))
}

// ratio is the run's time over the cell's ideal time.
func (r limResult) ratio() float64 { return r.elapsed.Seconds() / r.cell.ideal().Seconds() }

// limHeaders keeps the rate-limit headers of the first 200 and the first
// 429 a run saw, and every distinct Retry-After value sent with a 429.
type limHeaders struct {
	mu          sync.Mutex
	ok, refused http.Header
	retryAfter  []string
}

var limHeaderNames = []string{
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Increment",
	"X-Rate-Limit-Limit", "X-Rate-Limit-Duration",
	"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After",
}

func (s *limHeaders) record(status int, h http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := func() http.Header {
		out := http.Header{}
		for _, k := range limHeaderNames {
			if v := h.Values(k); len(v) > 0 {
				out[k] = slices.Clone(v)
			}
		}
		return out
	}
	switch status {
	case http.StatusOK:
		if s.ok == nil {
			s.ok = keep()
		}
	case http.StatusTooManyRequests:
		if s.refused == nil {
			s.refused = keep()
		}
		if v := h.Get("Retry-After"); !slices.Contains(s.retryAfter, v) {
			s.retryAfter = append(s.retryAfter, v)
		}
	}
}

// describe prints the headers kept, one answer per line.
func (s *limHeaders) describe() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := func(h http.Header) string {
		if h == nil {
			return "(none seen)"
		}
		var parts []string
		for _, k := range limHeaderNames {
			if v, ok := h[k]; ok {
				parts = append(parts, k+": "+strings.Join(v, ", "))
			}
		}
		if len(parts) == 0 {
			return "(no rate-limit header)"
		}
		return strings.Join(parts, "; ")
	}
	return fmt.Sprintf("first 200 recorded: %s\n  first 429 recorded: %s\n  Retry-After values on 429s: %q",
		line(s.ok), line(s.refused), s.retryAfter)
}

// limServer is the server side of a run: the counter outside the
// middleware, a simulated network latency, the middleware, and behind it
// the guarded handler.
type limServer struct {
	requests atomic.Int64
	refused  atomic.Int64
	seen     limHeaders
	cut      atomic.Value // string: why the run was cut short
	cancel   context.CancelFunc
	handler  http.Handler
}

func newLimServer(mw limMiddleware, cell limCell, cancel context.CancelFunc) *limServer {
	s := &limServer{cancel: cancel}
	guarded := mw.make(cell.quota, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(limService)
		body := "page " + strings.TrimPrefix(r.URL.Path, "/page/")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := s.requests.Add(1); n > limMaxRequests {
			s.cut.CompareAndSwap(nil, fmt.Sprintf("more than %d requests", limMaxRequests))
			s.cancel()
			http.Error(w, "request bound reached", http.StatusServiceUnavailable)
			return
		}
		time.Sleep(cell.latency)
		rec := &statusRecorder{ResponseWriter: w}
		guarded.ServeHTTP(rec, r)
		if rec.status == http.StatusTooManyRequests {
			s.refused.Add(1)
		}
		s.seen.record(rec.status, w.Header())
	})
	return s
}

// statusRecorder notes the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

// fetchAll is the client side of a run: workers take page numbers from
// one queue and send one GET each through client; a page is fetched when
// the final answer is a 200 with its body. Nothing is retried here: a
// status other than 200, or an error, leaves the page unfetched.
func fetchAll(ctx context.Context, client *http.Client, url string, workers int, srv *limServer) limResult {
	var (
		next                       atomic.Int64
		fetched, statusBack, nerrs atomic.Int64
		firstErr                   atomic.Value
		wg                         sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				page := next.Add(1)
				if page > limPages {
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/page/%d", url, page), nil)
				if err != nil {
					panic(err)
				}
				resp, err := client.Do(req)
				if err != nil {
					nerrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					nerrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case resp.StatusCode != http.StatusOK:
					statusBack.Add(1)
				case string(body) == "page "+strconv.FormatInt(page, 10):
					fetched.Add(1)
				default:
					nerrs.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("page %d: unexpected body %q", page, body))
				}
			}
		})
	}
	wg.Wait()
	r := limResult{
		fetched:    int(fetched.Load()),
		statusBack: int(statusBack.Load()),
		errs:       int(nerrs.Load()),
		requests:   srv.requests.Load(),
		refused:    srv.refused.Load(),
		elapsed:    time.Since(start),
	}
	if s, ok := firstErr.Load().(string); ok {
		r.firstErr = s
	}
	if s, ok := srv.cut.Load().(string); ok {
		r.cut = s
	} else if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.cut = "the run's deadline"
	}
	return r
}

// runMatrix runs every middleware x library pair in cell with run, in
// parallel subtests, and returns the results in the order of
// limMiddlewares and limClients.
func runMatrix(t *testing.T, cell limCell, run func(*testing.T, limCell, limMiddleware, limClient) limResult) []limResult {
	results := make([]limResult, len(limMiddlewares)*len(limClients))
	t.Run("runs", func(t *testing.T) {
		for i, mw := range limMiddlewares {
			for j, lc := range limClients {
				t.Run(mw.name+"/"+lc.name, func(t *testing.T) {
					t.Parallel()
					results[i*len(limClients)+j] = run(t, cell, mw, lc)
				})
			}
		}
	})
	return results
}
