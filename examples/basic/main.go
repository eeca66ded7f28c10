// Command basic shows retryhttp as a drop-in http.Client against a local
// server it starts itself: which answers are retried, which are not, and
// what the OnRetry hook and the logger say about each.
//
//	go run ./examples/basic
package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/retryhttp/retryhttp"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "basic:", err)
		os.Exit(1)
	}
}

// server is a local API whose paths fail in their own ways, and counts what
// reached it.
type server struct {
	mu   sync.Mutex
	hits map[string]int
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.hits[r.Method+" "+r.URL.Path]++
	n := s.hits[r.Method+" "+r.URL.Path]
	s.mu.Unlock()
	switch r.URL.Path {
	case "/flaky": // two 503s, then it works
		if n <= 2 {
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
	case "/limited": // a 429 that names its wait, then it works
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
	case "/missing": // a 404 does not change by asking again
		http.NotFound(w, r)
		return
	case "/orders": // a POST without an Idempotency-Key is not repeated
		io.Copy(io.Discard, r.Body)
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Hits is how many requests reached the server for method and path.
func (s *server) Hits(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[method+" "+path]
}

// run starts the server, sends four requests through a retryhttp client,
// and writes what happened to w.
func run(w io.Writer) error {
	srv := &server{hits: make(map[string]int)}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	// The logger writes one line per retry and per refused retry; the time
	// is dropped so that the lines read the same on every run.
	logger := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
	client := retryhttp.NewClient(
		retryhttp.WithMaxAttempts(4),                                     // 3 retries at most
		retryhttp.WithBackoff(50*time.Millisecond, 500*time.Millisecond), // short waits for a demo
		retryhttp.WithLogger(logger),
		retryhttp.WithOnRetry(func(e retryhttp.RetryEvent) {
			fmt.Fprintf(w, "  hook: try %d got %s, retrying\n", e.Attempt, outcome(e))
		}),
		retryhttp.WithOnGiveUp(func(e retryhttp.RetryEvent) {
			fmt.Fprintf(w, "  hook: try %d got %s, not retried: %s\n", e.Attempt, outcome(e), e.Reason)
		}),
		// One demo host plays every kind of server here; learning would
		// pace it after /limited's 429, and the later demos would wait.
		retryhttp.WithLearning(false),
	)
	defer client.CloseIdleConnections()

	requests := []struct{ method, path string }{
		{http.MethodGet, "/flaky"},
		{http.MethodGet, "/limited"},
		{http.MethodGet, "/missing"},
		{http.MethodPost, "/orders"},
	}
	for _, r := range requests {
		fmt.Fprintf(w, "%s %s\n", r.method, r.path)
		start := time.Now()
		var body io.Reader
		if r.method == http.MethodPost {
			body = strings.NewReader(`{"item": 1}`)
		}
		req, err := http.NewRequest(r.method, ts.URL+r.path, body)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Fprintf(w, "  => %s after %d request(s)%s\n", resp.Status, srv.Hits(r.method, r.path), waited(time.Since(start)))
	}
	return nil
}

// waited says how long a request took when it took long enough to notice.
func waited(d time.Duration) string {
	if d < 900*time.Millisecond {
		return ""
	}
	return fmt.Sprintf(", %.0f s of it waiting as the server asked", d.Seconds())
}

// outcome is what a try got: its status, or its error.
func outcome(e retryhttp.RetryEvent) string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return fmt.Sprint(e.Status)
}
