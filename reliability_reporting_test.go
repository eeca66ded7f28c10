package retryhttp

// What the Transport lets out: with a request full of secrets (user info,
// query, Authorization, Cookie, body), neither the log, nor the
// RetryEvents, nor the errors (a RetryError wrapping a *url.Error
// included) carry them. Issue 4.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const relSecret = "s3cret"

// relSecretRequest is a request that carries the secret everywhere a
// client puts one: the user info, the query, the Authorization and Cookie
// headers, and the body.
func relSecretRequest(t testing.TB, ctx context.Context, method, rawURL string, key bool) *http.Request {
	t.Helper()
	u := strings.Replace(rawURL, "://", "://user:"+relSecret+"@", 1) + "/v1/things?token=" + relSecret + "&x=1"
	var body io.Reader
	if method != http.MethodGet {
		body = strings.NewReader(`{"password":"` + relSecret + `"}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+relSecret)
	req.Header.Set("Cookie", "session="+relSecret)
	if key {
		req.Header.Set("Idempotency-Key", "key-"+relSecret)
	}
	return req
}

// TestReliabilityNoSecretsInLogs drives the Transport through every kind
// of retry and refusal with a request full of secrets: the JSON log, the
// RetryEvents as printed, and the errors' text never carry them.
func TestReliabilityNoSecretsInLogs(t *testing.T) {
	relNoLeaks(t)
	srv := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.Header.Get("X-Rel-Mode") {
		case "reset":
			relHijackReset(w)
		case "later":
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
		case "soon":
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("token=" + relSecret))
		}
	}), relServerOpts{})
	refused := "http://" + closedPort(t)
	base := relH1Base()
	t.Cleanup(base.CloseIdleConnections)

	var (
		logBuf bytes.Buffer
		logMu  sync.Mutex
		events []string
		errs   []string
	)
	logger := slog.New(slog.NewJSONHandler(relLockedWriter{&logMu, &logBuf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	newTr := func(extra ...Option) *Transport {
		return New(append([]Option{
			WithBase(base), WithLogger(logger), WithBudget(nil),
			WithBackoff(time.Millisecond, 2*time.Millisecond),
			WithRetryAfterLimits(time.Millisecond, 10*time.Second),
			onEvents(func(ev RetryEvent) {
				logMu.Lock()
				events = append(events, fmt.Sprintf("%v\n%+v", ev, ev))
				logMu.Unlock()
			}),
		}, extra...)...)
	}
	cases := []struct {
		name, method, mode, url string
		key                     bool
		opts                    []Option
		deadline                bool
		noGetBody               bool
		twice                   bool // a second request meets the parked host
	}{
		{name: "503 out of attempts", method: http.MethodGet},
		{name: "503 on an unkeyed POST", method: http.MethodPost},
		{name: "reset", method: http.MethodPut, mode: "reset"},
		{name: "connection refused", method: http.MethodGet, url: refused},
		{name: "Retry-After beyond max, then parked", method: http.MethodGet, mode: "later", twice: true},
		{name: "Retry-After past the deadline", method: http.MethodGet, mode: "soon", deadline: true},
		{name: "budget spent", method: http.MethodGet, opts: []Option{WithBudget(NewBudget(0, 0))}},
		{name: "body without GetBody, copying off", method: http.MethodPost, key: true, noGetBody: true, opts: []Option{WithReplayLimit(-1)}},
		{name: "keyed POST", method: http.MethodPost, key: true, mode: "reset"},
	}
	for _, c := range cases {
		url := srv.URL
		if c.url != "" {
			url = c.url
		}
		tr := newTr(c.opts...)
		for range 1 + relBtoi(c.twice) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if c.deadline {
				cancel()
				ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
			}
			req := relSecretRequest(t, ctx, c.method, url, c.key)
			req.Header.Set("X-Rel-Mode", c.mode)
			if c.noGetBody {
				req.GetBody = nil
			}
			resp, err := tr.RoundTrip(req)
			cancel()
			if resp != nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v | %+v | %s", c.name, err, err, err.Error()))
			}
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	log := logBuf.String()
	t.Logf("log:\n%s", log)
	t.Logf("errors:\n%s", strings.Join(errs, "\n"))
	for what, text := range map[string]string{
		"the log":    log,
		"the events": strings.Join(events, "\n"),
		"the errors": strings.Join(errs, "\n"),
	} {
		if strings.Contains(text, relSecret) {
			t.Errorf("%s carry the secret:\n%s", what, text)
		}
	}
	// The log said something useful all the same.
	for _, want := range []string{`"path":"/v1/things"`, `"reason":"` + string(ReasonNotIdempotent), `"reason":"` + string(ReasonBudget),
		`"reason":"` + string(ReasonServerWait), `"reason":"` + string(ReasonDeadline), `"reason":"` + string(ReasonNoRewind), `"attempt":"2 of 3"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s", want)
		}
	}
	if len(errs) < 4 || len(events) < 10 {
		t.Errorf("only %d errors and %d events: the cases did not run as meant", len(errs), len(events))
	}
}

func relBtoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// relLockedWriter serialises writes to a buffer.
type relLockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l relLockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestReliabilityRetryErrorRedactsWrappedURL: a base that reports its
// failures as *url.Error (one that delegates to an http.Client, say) puts
// the full URL, query included, in the error. The log strips it; the
// RetryError, whose own URL field is redacted, must not carry it in its
// text either.
func TestReliabilityRetryErrorRedactsWrappedURL(t *testing.T) {
	var logBuf bytes.Buffer
	base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, &url.Error{Op: "Get", URL: r.URL.String(), Err: syscall.ECONNRESET}
	})
	tr := New(WithBase(base), WithBudget(nil), WithBackoff(time.Nanosecond, time.Nanosecond),
		WithLogger(slog.New(slog.NewJSONHandler(&logBuf, nil))))
	_, err := tr.RoundTrip(relSecretRequest(t, context.Background(), http.MethodGet, "http://wrapped.test", false))
	if err == nil || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("error %v, want one that wraps ECONNRESET", err)
	}
	if strings.Contains(logBuf.String(), relSecret) {
		t.Errorf("the log carries the secret:\n%s", logBuf.String())
	}
	if strings.Contains(err.Error(), relSecret) {
		t.Errorf("the RetryError's text carries the query: %s", err)
	}
}

// TestErrorsSayWhy: an error for a request tried once says why it was not
// tried again, and through an http.Client the method and URL appear once
// (net/http's *url.Error says them). The log gives waits as seconds, a
// number in JSON, and an empty path as "/".
func TestErrorsSayWhy(t *testing.T) {
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	tlsSrv.Config.ErrorLog = relQuietLog() // the handshake the client refuses
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	refused := "http://" + closedPort(t)
	// A server that resets the connection once it has the request: the
	// POST may have been acted on.
	resetting := relStart(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		relHijackReset(w)
	}), relServerOpts{})
	for _, tc := range []struct {
		name, method, url string
		opts              []Option
		want              string
	}{
		{"certificate", http.MethodGet, tlsSrv.URL, nil, "retryhttp: not retried (certificate error): "},
		{"not idempotent", http.MethodPost, resetting.URL + "/", nil, "retryhttp: not retried (not idempotent): "},
		{"retries off", http.MethodGet, refused, []Option{WithMaxAttempts(1)}, "retryhttp: not retried (retries off): "},
		{"gave up", http.MethodGet, refused, nil, "retryhttp: gave up after 3 attempts over "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]Option{WithBackoff(time.Millisecond, time.Millisecond), WithLogger(logger)}, tc.opts...)
			client := &http.Client{Transport: New(opts...)}
			req, _ := http.NewRequest(tc.method, tc.url, strings.NewReader("x"))
			_, err := client.Do(req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to say %q", err, tc.want)
			}
			if n := strings.Count(err.Error(), strings.TrimPrefix(tc.url, "http")); n != 1 {
				t.Errorf("%q names the URL %d times, want once", err, n)
			}
		})
	}
	logMu.Lock()
	defer logMu.Unlock()
	for _, want := range []string{`"path":"/"`, `"wait":0`, `"attempt":"2 of 3"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, logs.String())
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
