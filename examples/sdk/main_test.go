package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestDemo(t *testing.T) {
	s := newStub()
	ts := httptest.NewServer(s)
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := demo(ctx, &out, s, ts.URL); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}

	customers := s.Seen("/v1/customers")
	if len(customers) != 3 {
		t.Fatalf("the stub saw %d customer requests, want 2 for the first and 1 for the bad email: %+v", len(customers), customers)
	}
	first, retry, bad := customers[0], customers[1], customers[2]
	if first.Status != http.StatusServiceUnavailable || retry.Status != http.StatusOK {
		t.Errorf("statuses %d, %d; want 503, 200", first.Status, retry.Status)
	}
	if first.Method != http.MethodPost || first.IdempotencyKey == "" || retry.IdempotencyKey != first.IdempotencyKey {
		t.Errorf("the retry carried Idempotency-Key %q, the first try %q: want the same, non-empty",
			retry.IdempotencyKey, first.IdempotencyKey)
	}
	if retry.Form != first.Form || !strings.Contains(first.Form, "email=ada%40example.com") {
		t.Errorf("the retry's body %q differs from the first's %q", retry.Form, first.Form)
	}
	if bad.Status != http.StatusBadRequest || bad.IdempotencyKey == first.IdempotencyKey {
		t.Errorf("the bad email got %d with key %q", bad.Status, bad.IdempotencyKey)
	}
	if intents := s.Seen("/v1/payment_intents"); len(intents) != 1 || intents[0].Status != http.StatusPaymentRequired {
		t.Errorf("payment intents: %+v, want one request answered 402", intents)
	}

	got := out.String()
	for _, want := range []string{
		"  retryhttp: try 1 got 503, retrying with Idempotency-Key " + first.IdempotencyKey + "\n",
		"  created cus_local1 (ada@example.com)\n",
		"  the stub saw 2 requests, answered 503, 200, all with the same Idempotency-Key\n",
		"  error: 402 card_declined: Your card was declined.\n  the stub saw 1 request, answered 402: not retried\n",
		"  error: 400 email_invalid: Invalid email address\n  the stub saw 1 request, answered 400: not retried\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q; it is:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "retryhttp: try"); n != 1 {
		t.Errorf("%d retries reported, want 1:\n%s", n, got)
	}
}

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "created cus_local1") {
		t.Errorf("unexpected output:\n%s", out.String())
	}
}
