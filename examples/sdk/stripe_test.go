package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stripe/stripe-go/v82"
)

func stripeReply(status int, typ, code string, header ...string) reply {
	h := map[string]string{"Content-Type": "application/json"}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return reply{status, h, fmt.Sprintf(`{"error": {"type": %q, "code": %q, "message": "stub says %d"}}`, typ, code, status)}
}

var (
	stripeCustomer  = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"}, `{"id": "cus_1", "object": "customer"}`}
	stripeRateLimit = stripeReply(http.StatusTooManyRequests, "invalid_request_error", "rate_limit")
	stripeLock      = stripeReply(http.StatusTooManyRequests, "invalid_request_error", "lock_timeout")
	stripeDown      = stripeReply(http.StatusServiceUnavailable, "api_error", "")
	// A 503 from something in front of the API: not Stripe's JSON.
	proxyDown = reply{http.StatusServiceUnavailable, map[string]string{"Content-Type": "text/html"}, "<html>503 Service Unavailable</html>"}
)

func withHeader(r reply, k, v string) reply {
	h := map[string]string{}
	for hk, hv := range r.header {
		h[hk] = hv
	}
	h[k] = v
	r.header = h
	return r
}

// stripeWithRetries is newStripe with stripe-go's retries left as they
// are by default (MaxNetworkRetries 2).
func stripeWithRetries(baseURL string, hc *http.Client) *stripe.Client {
	return stripe.NewClient("sk_test_local", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:             stripe.String(baseURL),
		HTTPClient:      hc,
		EnableTelemetry: stripe.Bool(false),
		LeveledLogger:   &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
}

func createCustomer(sc *stripe.Client) (*stripe.Customer, error) {
	return sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{Email: stripe.String("ada@example.com")})
}

// checkStripeError fails t unless err is the *stripe.Error of the answer.
func checkStripeError(t *testing.T, err error, status int, code stripe.ErrorCode) {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != status || se.Code != code {
		t.Errorf("err = %v, want a *stripe.Error %d %q", err, status, code)
	}
}

// TestStripeRateLimitAbsorbed proves that a 429 with Retry-After: 1 that
// retryhttp absorbs is invisible to the caller of a POST, whose retry
// carries the Idempotency-Key stripe-go set.
func TestStripeRateLimitAbsorbed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(withHeader(stripeRateLimit, "Retry-After", "1"), stripeCustomer))
		start := time.Now()
		cus, err := createCustomer(newStripe(url, fast(base)))
		if err != nil || cus.ID != "cus_1" {
			t.Fatalf("Create: %v, %v", cus, err)
		}
		hits := rec.Hits()
		if len(hits) != 2 || time.Since(start) < time.Second {
			t.Errorf("the stub answered %s in %v, want 2 requests a second apart", statuses(hits), time.Since(start))
		}
		if key := hits[0].Header.Get("Idempotency-Key"); key == "" || hits[1].Header.Get("Idempotency-Key") != key {
			t.Errorf("Idempotency-Keys %q, %q: want the same, set by stripe-go",
				key, hits[1].Header.Get("Idempotency-Key"))
		}
	})
}

// TestStripeRateLimitHandedBack proves what the caller gets when retryhttp
// gives up on a 429: after three (Stripe names no wait), or at once on a
// Retry-After beyond 60 s, a *stripe.Error with the status and code; while
// the host is parked after the latter, an error that is ErrHostPaused,
// without a request sent.
func TestStripeRateLimitHandedBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer reply
		hits   int
	}{
		{"429 every time", stripeRateLimit, 3},
		{"429 Retry-After: 120", withHeader(stripeRateLimit, "Retry-After", "120"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.answer))
				sc := newStripe(url, fast(base))
				_, err := createCustomer(sc)
				checkStripeError(t, err, http.StatusTooManyRequests, stripe.ErrorCodeRateLimit)
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
				if tc.hits != 1 {
					return
				}
				nextCallParked(t, rec, "Create", func() error { _, err := createCustomer(sc); return err })
			})
		})
	}
}

// TestStripeRetries proves how many requests one POST costs on a host that
// fails every time, with stripe-go's retries off (MaxNetworkRetries 0) and
// left at their default (2) under retryhttp. stripe-go retries only what it
// could not read as a Stripe error, and a 429 lock_timeout: a 503 with
// Stripe's JSON error is not retried by stripe-go even when
// Stripe-Should-Retry says true, and it comes back as a *stripe.Error; a 503
// page from a proxy is retried, 3 × 3, and comes back as a plain error.
func TestStripeRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answer  reply
		off, on int // requests with stripe-go's retries off, and on
	}{
		{"503 api_error", stripeDown, 3, 3},
		{"503 api_error, Stripe-Should-Retry: true", withHeader(stripeDown, "Stripe-Should-Retry", "true"), 3, 3},
		{"503 from a proxy", proxyDown, 3, 9},
		{"429 rate_limit", stripeRateLimit, 3, 3},
		{"429 lock_timeout", stripeLock, 3, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, on := range []bool{false, true} {
				synctest.Test(t, func(t *testing.T) {
					rec, url, base := bubbleStub(t, replies(tc.answer))
					sc, want := newStripe(url, layered(base)), tc.off
					if on {
						sc, want = stripeWithRetries(url, layered(base)), tc.on
					}
					_, err := createCustomer(sc)
					if hits := rec.Hits(); len(hits) != want {
						t.Errorf("stripe-go retries on: %v: the stub saw %d requests, want %d", on, len(hits), want)
					}
					var se *stripe.Error
					if got, want := errors.As(err, &se), strings.HasPrefix(tc.answer.body, "{"); got != want {
						t.Errorf("err = %v (%T): a *stripe.Error: %v, want %v", err, err, got, want)
					}
				})
			}
		})
	}
}
