// Command sdk wraps a real SDK's HTTP client with retryhttp: stripe-go,
// whose POSTs carry an Idempotency-Key, with its own retries turned off so
// that retryhttp retries in one place only. It talks to a local stub of the
// Stripe API, never to Stripe.
//
//	cd examples/sdk && go run .
//
// setup.go configures aws-sdk-go-v2's S3, slack-go, openai-go,
// anthropic-sdk-go, azcore, go-github and minio-go the same way; the tests
// prove, against the real SDKs, what each then does (README.md).
//
// It is a module of its own so that the core's go.mod depends on none of
// them.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/retryhttp/retryhttp"
	"github.com/stripe/stripe-go/v82"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sdk:", err)
		os.Exit(1)
	}
}

// stub is a local stand-in for the Stripe API:
//   - POST /v1/customers answers 503 to the first try of each
//     Idempotency-Key and creates the customer on the next, as Stripe does
//     when a request fails on its side before doing anything; an email
//     without "@" is refused 400;
//   - POST /v1/payment_intents answers 402, card declined.
//
// It records every request it saw.
type stub struct {
	mu        sync.Mutex
	requests  []seen
	byKey     map[string]int
	customers int
}

type seen struct {
	Method, Path, IdempotencyKey string
	Form                         string // the body, as the stub parsed it
	Status                       int
}

func newStub() *stub { return &stub{byKey: make(map[string]int)} }

func (s *stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.ParseForm()
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.byKey[key]++
	try := s.byKey[key]
	s.mu.Unlock()

	status, body := http.StatusOK, ""
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/customers":
		switch {
		case !strings.Contains(r.PostForm.Get("email"), "@"):
			status, body = http.StatusBadRequest, stripeError("invalid_request_error", "email_invalid", "Invalid email address")
		case try == 1:
			status, body = http.StatusServiceUnavailable, stripeError("api_error", "", "Service temporarily unavailable")
		default:
			s.mu.Lock()
			s.customers++
			id := s.customers
			s.mu.Unlock()
			body = fmt.Sprintf(`{"id": "cus_local%d", "object": "customer", "email": %q}`, id, r.PostForm.Get("email"))
		}
	case r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents":
		status, body = http.StatusPaymentRequired, stripeError("card_error", "card_declined", "Your card was declined.")
	default:
		status, body = http.StatusNotFound, stripeError("invalid_request_error", "", "Unrecognized request URL")
	}

	s.mu.Lock()
	s.requests = append(s.requests, seen{r.Method, r.URL.Path, key, r.PostForm.Encode(), status})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", try))
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func stripeError(typ, code, msg string) string {
	return fmt.Sprintf(`{"error": {"type": %q, "code": %q, "message": %q}}`, typ, code, msg)
}

// Seen returns the requests the stub saw to path, in order.
func (s *stub) Seen(path string) []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []seen
	for _, r := range s.requests {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// newStripe returns a stripe client whose every request goes through hc to
// baseURL, with stripe-go's own retries off.
func newStripe(baseURL string, hc *http.Client) *stripe.Client {
	config := &stripe.BackendConfig{
		URL:               stripe.String(baseURL),
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0), // retryhttp retries; stripe-go must not retry again
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	}
	return stripe.NewClient("sk_test_local", stripe.WithBackends(stripe.NewBackendsWithConfig(config)))
}

// run starts the stub, makes three calls through stripe-go and retryhttp,
// and writes what reached the stub for each.
func run(w io.Writer) error {
	s := newStub()
	ts := httptest.NewServer(s)
	defer ts.Close()
	return demo(context.Background(), w, s, ts.URL)
}

func demo(ctx context.Context, w io.Writer, s *stub, baseURL string) error {
	sc := newStripe(baseURL, retryhttp.NewClient(
		retryhttp.WithBackoff(20*time.Millisecond, 200*time.Millisecond), // short waits for a demo
		retryhttp.WithOnRetry(func(e retryhttp.RetryEvent) {
			if e.Reason == "" {
				fmt.Fprintf(w, "  retryhttp: try %d got %d, retrying with Idempotency-Key %s\n",
					e.Attempt, e.Status, e.Request.Header.Get("Idempotency-Key"))
			}
		}),
	))

	fmt.Fprintln(w, "V1Customers.Create, answered 503 then 200:")
	cus, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("ada@example.com")})
	if err != nil {
		return fmt.Errorf("creating a customer: %w", err)
	}
	fmt.Fprintf(w, "  created %s (%s)\n", cus.ID, cus.Email)
	report(w, s.Seen("/v1/customers"))

	fmt.Fprintln(w, "V1PaymentIntents.Create, answered 402:")
	_, err = sc.V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{
		Amount: stripe.Int64(2000), Currency: stripe.String("eur"),
	})
	if err := declined(err, stripe.ErrorCodeCardDeclined); err != nil {
		return err
	}
	fmt.Fprintf(w, "  error: %s\n", stripeMessage(err))
	report(w, s.Seen("/v1/payment_intents"))

	fmt.Fprintln(w, "V1Customers.Create with a bad email, answered 400:")
	before := len(s.Seen("/v1/customers"))
	_, err = sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("not-an-email")})
	if err := declined(err, stripe.ErrorCodeEmailInvalid); err != nil {
		return err
	}
	fmt.Fprintf(w, "  error: %s\n", stripeMessage(err))
	report(w, s.Seen("/v1/customers")[before:])
	return nil
}

// declined checks that err is the Stripe error with the given code.
func declined(err error, code stripe.ErrorCode) error {
	var se *stripe.Error
	if !errors.As(err, &se) || se.Code != code {
		return fmt.Errorf("want a Stripe error %q, got %v", code, err)
	}
	return nil
}

func stripeMessage(err error) string {
	var se *stripe.Error
	if errors.As(err, &se) {
		return fmt.Sprintf("%d %s: %s", se.HTTPStatusCode, se.Code, se.Msg)
	}
	return err.Error()
}

// report says how many requests reached the stub, what it answered, and
// with which Idempotency-Keys.
func report(w io.Writer, reqs []seen) {
	keys := make(map[string]bool)
	statuses := make([]string, len(reqs))
	for i, r := range reqs {
		keys[r.IdempotencyKey] = true
		statuses[i] = fmt.Sprint(r.Status)
	}
	switch {
	case len(reqs) == 1:
		fmt.Fprintf(w, "  the stub saw 1 request, answered %s: not retried\n", statuses[0])
	case len(keys) == 1:
		fmt.Fprintf(w, "  the stub saw %d requests, answered %s, all with the same Idempotency-Key\n",
			len(reqs), strings.Join(statuses, ", "))
	default:
		fmt.Fprintf(w, "  the stub saw %d requests, answered %s, with %d different Idempotency-Keys\n",
			len(reqs), strings.Join(statuses, ", "), len(keys))
	}
}
