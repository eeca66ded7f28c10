package retryhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/retryhttp/retryhttp"
)

// flaky answers 503 to the first n requests, then 200.
func flaky(n int32, headers map[string]string) *httptest.Server {
	var seen atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) <= n {
			for k, v := range headers {
				w.Header().Set(k, v)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}))
}

// The drop-in use: a client whose requests are retried, paced and bounded
// by the defaults.
func Example() {
	srv := flaky(1, nil)
	defer srv.Close()

	client := &http.Client{Transport: retryhttp.New()}
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output: 200 ok
}

// Any SDK that accepts an *http.Client gets the same behaviour: hand it
// NewClient's. Turn the SDK's own retries off, so they are not multiplied.
func ExampleNewClient() {
	srv := flaky(2, nil)
	defer srv.Close()

	client := retryhttp.NewClient(retryhttp.WithMaxAttempts(4))
	client.Timeout = 30 * time.Second // the whole call, waits included
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.Status)
	// Output: 200 OK
}

// OnRetry sees every retry just before it is sent; OnGiveUp sees a
// failure handed back although it was worth a retry, with the reason.
func ExampleWithOnRetry() {
	srv := flaky(5, nil)
	defer srv.Close()

	tr := retryhttp.New(
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
		retryhttp.WithOnRetry(func(e retryhttp.RetryEvent) {
			fmt.Printf("try %d: %d, retrying\n", e.Attempt, e.Status)
		}),
		retryhttp.WithOnGiveUp(func(e retryhttp.RetryEvent) {
			if e.Reason == retryhttp.ReasonAttempts {
				fmt.Printf("try %d: %d, not retried: %s\n", e.Attempt, e.Status, e.Reason)
			}
		}),
	)
	resp, _ := (&http.Client{Transport: tr}).Get(srv.URL)
	resp.Body.Close()
	fmt.Println("returned", resp.StatusCode)
	// Output:
	// try 1: 503, retrying
	// try 2: 503, retrying
	// try 3: 503, not retried: out of attempts
	// returned 503
}

// A logger gets one line per retry: method, host, path without the query,
// attempt, status or error, and the wait. Headers are never logged.
func ExampleWithLogger() {
	srv := flaky(1, nil)
	defer srv.Close()

	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case "time", "host", "wait":
				return slog.Attr{} // vary from run to run
			}
			return a
		},
	}))
	tr := retryhttp.New(retryhttp.WithLogger(logger), retryhttp.WithBackoff(time.Millisecond, time.Millisecond))
	resp, _ := (&http.Client{Transport: tr}).Get(srv.URL + "/v1/items?token=secret")
	resp.Body.Close()
	// Output:
	// level=INFO msg="retryhttp: retrying" method=GET path=/v1/items attempt="2 of 3" status=503
}

// A server's Retry-After is obeyed within bounds: never less than the
// floor, and a wait beyond the max is not slept through.
func ExampleWithRetryAfterLimits() {
	srv := flaky(1, map[string]string{"Retry-After": "0"})
	defer srv.Close()

	tr := retryhttp.New(retryhttp.WithRetryAfterLimits(50*time.Millisecond, 2*time.Second))
	start := time.Now()
	resp, _ := (&http.Client{Transport: tr}).Get(srv.URL)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after at least the floor:", time.Since(start) >= 50*time.Millisecond)
	// Output: 200 after at least the floor: true
}

// A host that asks for more than the max wait is parked: the answer comes
// back at once, and the next request fails fast instead of hammering it.
func ExampleErrHostPaused() {
	srv := flaky(1, map[string]string{"Retry-After": "3600"})
	defer srv.Close()

	client := retryhttp.NewClient()
	resp, _ := client.Get(srv.URL)
	resp.Body.Close()
	fmt.Println("first:", resp.StatusCode)

	_, err := client.Get(srv.URL)
	fmt.Println("second fails fast:", errors.Is(err, retryhttp.ErrHostPaused))
	// Output:
	// first: 503
	// second fails fast: true
}

// A POST is retried only when it is safe: with an Idempotency-Key, which
// WithAutoIdempotencyKey adds once and sends on every try.
func ExampleWithAutoIdempotencyKey() {
	var keys []string
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if seen.Add(1) == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client := retryhttp.NewClient(retryhttp.WithAutoIdempotencyKey(),
		retryhttp.WithBackoff(time.Millisecond, time.Millisecond))
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"amount":10}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "tries:", len(keys), "same key:", keys[0] == keys[1] && keys[0] != "")
	// Output: 201 tries: 2 same key: true
}

// Pace every host at 20 requests a second with bursts of 5, and one slow
// host at 2 a second. Retries spend tokens too.
func ExampleWithPace() {
	srv := flaky(0, nil)
	defer srv.Close()

	client := retryhttp.NewClient(
		retryhttp.WithPace(20, 5),
		retryhttp.WithHostPace("slow.example.com", 2, 1),
	)
	start := time.Now()
	for range 7 {
		resp, err := client.Get(srv.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}
	// 5 at once, then 2 more at 20/s: at least 100 ms.
	fmt.Println(time.Since(start) >= 90*time.Millisecond)
	// Output: true
}

// One budget shared by every Transport of a process caps the retries of
// all of them at a share of their first tries.
func ExampleNewBudget() {
	srv := flaky(1000, nil) // an outage
	defer srv.Close()

	budget := retryhttp.NewBudget(0.1, 0) // 10 % of first tries, no reserve
	var retries atomic.Int32
	opts := []retryhttp.Option{
		retryhttp.WithBudget(budget),
		// Off, so that the outage is not also paced, and the example quick.
		retryhttp.WithLearning(false),
		retryhttp.WithBackoff(time.Millisecond, time.Millisecond),
		retryhttp.WithOnRetry(func(retryhttp.RetryEvent) { retries.Add(1) }),
	}
	a, b := retryhttp.NewClient(opts...), retryhttp.NewClient(opts...)
	for i := range 20 {
		client := a
		if i%2 == 1 {
			client = b
		}
		resp, _ := client.Get(srv.URL)
		resp.Body.Close()
	}
	fmt.Println("retries for 20 failing requests:", retries.Load())
	// Output: retries for 20 failing requests: 2
}

// When the last try ends in an error, RoundTrip says how it went, and the
// cause stays reachable with errors.Is and errors.As.
func ExampleRetryError() {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/v1/x"
	srv.Close() // nothing listens any more

	tr := retryhttp.New(retryhttp.WithBackoff(time.Millisecond, time.Millisecond))
	req, _ := http.NewRequestWithContext(context.Background(), "GET", url, nil)
	_, err := tr.RoundTrip(req)
	var re *retryhttp.RetryError
	if errors.As(err, &re) {
		fmt.Println(re.Method, "attempts:", re.Attempts)
	}
	// Output: GET attempts: 3
}

// A policy on a request's context changes that request's retries: more
// tries for one that must get through, none for a health check.
func ExampleContextWithPolicy() {
	srv := flaky(3, nil)
	defer srv.Close()
	client := retryhttp.NewClient(
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
		retryhttp.WithLearning(false), // this server fails whatever the pace
	)

	probe := retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicyNoRetry())
	req, _ := http.NewRequestWithContext(probe, http.MethodGet, srv.URL, nil)
	resp, _ := client.Do(req)
	resp.Body.Close()
	fmt.Println("health check:", resp.StatusCode)

	mustGet := retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicyMaxAttempts(5))
	req, _ = http.NewRequestWithContext(mustGet, http.MethodGet, srv.URL, nil)
	resp, _ = client.Do(req)
	resp.Body.Close()
	fmt.Println("must get:", resp.StatusCode)
	// Output:
	// health check: 503
	// must get: 200
}

// A body without GetBody, such as an SDK's own reader, is copied as the
// base reads it (up to 256 KiB by default) and sent again on a retry.
func ExampleWithReplayLimit() {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("try %d: %d bytes\n", tries.Add(1), len(body))
		if tries.Load() == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	client := retryhttp.NewClient(
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
		retryhttp.WithReplayLimit(1<<20), // bodies up to 1 MiB can be retried
	)
	upload := io.NopCloser(strings.NewReader(strings.Repeat("x", 64<<10))) // no GetBody
	req, _ := http.NewRequest(http.MethodPut, srv.URL, upload)
	resp, _ := client.Do(req)
	resp.Body.Close()
	fmt.Println(resp.Status)
	// Output:
	// try 1: 65536 bytes
	// try 2: 65536 bytes
	// 200 OK
}

// One more status worth retrying, without restating the defaults: an API
// that answers 409 to a conflict that passes.
func ExampleWithExtraRetryStatuses() {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tries.Add(1) == 1 {
			w.WriteHeader(http.StatusConflict)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()

	client := retryhttp.NewClient(
		retryhttp.WithExtraRetryStatuses(http.StatusConflict), // 408, 429, 5xx and 529 stay
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
	)
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", tries.Load(), "tries")
	// Output: 200 after 2 tries
}

// An LLM completion is a POST without an idempotency key: after a 500 or a
// 503 it is sent once, since the server may have acted on it. A client that
// knows its completions are safe to repeat says which requests are.
func ExampleWithSafeToRepeat() {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("try %d: %s %s %s\n", tries.Add(1), r.Method, r.URL.Path, body)
		if tries.Load() == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, `{"choices": []}`)
	}))
	defer srv.Close()

	client := retryhttp.NewClient(
		retryhttp.WithSafeToRepeat(func(r *http.Request) bool {
			return r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions"
		}),
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
	)
	resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model": "m"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.Status)
	// Output:
	// try 1: POST /v1/chat/completions {"model": "m"}
	// try 2: POST /v1/chat/completions {"model": "m"}
	// 200 OK
}

// One call, or one task, can be said to be safe to repeat through its
// context: here a search sent as a POST.
func ExamplePolicySafeToRepeat() {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tries.Add(1) <= 2 {
			w.WriteHeader(http.StatusInternalServerError) // the first two requests
			return
		}
		io.WriteString(w, `{"hits": 3}`)
	}))
	defer srv.Close()
	client := retryhttp.NewClient(retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond))

	search := func(ctx context.Context) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/search", strings.NewReader(`{"q": "go"}`))
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println("unsaid:", search(context.Background()))
	fmt.Println("safe to repeat:", search(retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicySafeToRepeat())))
	fmt.Println("requests:", tries.Load())
	// Output:
	// unsaid: 500
	// safe to repeat: 200
	// requests: 3
}

// S3 may answer CompleteMultipartUpload 200 OK with an <Error> in the body
// (the status is sent before the work is done). A predicate reads the start
// of the body with PeekBody, and the caller still gets all of it. The call
// is a POST, which S3 documents as safe to send again: WithSafeToRepeat says
// so for it alone.
func ExamplePeekBody() {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		if tries.Add(1) == 1 {
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
				`<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>`)
			return
		}
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
			`<CompleteMultipartUploadResult><Key>big.bin</Key><ETag>"3858f62230ac3c915f300c664312c11f-2"</ETag></CompleteMultipartUploadResult>`)
	}))
	defer srv.Close()

	completing := func(r *http.Request) bool {
		return r.Method == http.MethodPost && r.URL.Query().Has("uploadId")
	}
	client := retryhttp.NewClient(
		retryhttp.WithSafeToRepeat(completing),
		retryhttp.WithRetryIf(func(resp *http.Response, err error) bool {
			if resp != nil && resp.StatusCode == http.StatusOK && completing(resp.Request) {
				prefix, _ := retryhttp.PeekBody(resp, 512)
				return bytes.Contains(prefix, []byte("<Error>")) && bytes.Contains(prefix, []byte("<Code>InternalError</Code>"))
			}
			return retryhttp.DefaultRetryIf(resp, err)
		}),
		retryhttp.WithBackoff(time.Millisecond, 10*time.Millisecond),
	)
	resp, err := client.Post(srv.URL+"/bucket/big.bin?uploadId=u1", "application/xml", strings.NewReader("<CompleteMultipartUpload/>"))
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(tries.Load(), "tries:", bytes.Contains(body, []byte("<CompleteMultipartUploadResult>")))
	// Output: 2 tries: true
}

// An attempt that hangs is abandoned after its timeout and, a GET being
// safe to repeat, tried again at once.
func ExampleWithAttemptTimeout() {
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) == 1 {
			<-r.Context().Done() // hangs until the client lets go
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()

	client := retryhttp.NewClient(retryhttp.WithAttemptTimeout(100 * time.Millisecond))
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "after", seen.Load(), "attempts")
	// Output: 200 ok after 2 attempts
}

// One call can have an attempt timeout of its own, here a health check
// that must answer fast or not at all.
func ExamplePolicyAttemptTimeout() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	}))
	defer srv.Close()

	client := retryhttp.NewClient()
	ctx := retryhttp.ContextWithPolicy(context.Background(),
		retryhttp.PolicyAttemptTimeout(50*time.Millisecond), retryhttp.PolicyNoRetry())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/healthz", nil)
	_, err := client.Do(req)
	var timeout *retryhttp.AttemptTimeoutError
	fmt.Println(errors.As(err, &timeout), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// A slow first attempt gets a second one after the hedging delay; the
// first answer wins and the other attempt is cancelled.
func ExampleWithHedging() {
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) == 1 {
			select { // the slow replica
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "fast")
	}))
	defer srv.Close()

	client := retryhttp.NewClient(retryhttp.WithHedging(50 * time.Millisecond))
	start := time.Now()
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(string(body), time.Since(start) < time.Second)
	// Output: fast true
}

// A host nothing gets through to is down: after a run of refused
// connections, requests to it are handed back at once, without a dial,
// but for a probe every half second.
func ExampleTransport_HostStatus() {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // a dead address: every connection is refused

	tr := retryhttp.New(retryhttp.WithBackoff(time.Millisecond, time.Millisecond))
	client := &http.Client{Transport: tr}
	if _, err := client.Get(url); err != nil {
		fmt.Println("first call failed")
	}
	st, _ := tr.HostStatus(context.Background(), url)
	fmt.Println(st.State)

	_, err := client.Get(url)
	fmt.Println(errors.Is(err, retryhttp.ErrHostDown))
	// Output:
	// first call failed
	// down
	// true
}
