package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/retryhttp/retryhttp"
)

func anthropicError(status int, typ string, header ...string) reply {
	h := map[string]string{"Content-Type": "application/json"}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return reply{status, h, `{"type": "error", "error": {"type": "` + typ + `", "message": "stub says ` + http.StatusText(status) + `"}}`}
}

var (
	anthropicMessage = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"},
		`{"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
		  "content": [{"type": "text", "text": "Hello"}], "stop_reason": "end_turn",
		  "usage": {"input_tokens": 3, "output_tokens": 1}}`}
	anthropicModels = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"},
		`{"data": [{"id": "claude-sonnet-4-5", "type": "model", "display_name": "Claude Sonnet 4.5", "created_at": "2025-09-29T00:00:00Z"}],
		  "has_more": false, "first_id": "claude-sonnet-4-5", "last_id": "claude-sonnet-4-5"}`}
	anthropicOverloaded = anthropicError(529, "overloaded_error")
)

func anthropicAt(url string, hc *http.Client, opts ...anthropicopt.RequestOption) anthropic.Client {
	return newAnthropic(url, hc, opts...)
}

func message(ctx context.Context, c anthropic.Client) error {
	_, err := c.Messages.New(ctx, anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello"))},
	})
	return err
}

func anthropicModelsList(c anthropic.Client) error {
	_, err := c.Models.List(context.Background(), anthropic.ModelListParams{})
	return err
}

func checkAnthropicError(t *testing.T, err error, status int) {
	t.Helper()
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != status {
		t.Errorf("err = %v (%T), want an *anthropic.Error %d", err, err, status)
	}
}

// TestAnthropicOverloaded proves what a 529 (overloaded_error) costs: on
// Models.List, a GET, it is asked again (a 529 once: 2 requests and the
// models; every time: 3 tries, then the last 529 as an *anthropic.Error);
// on Messages.New, a POST without an idempotency key, it is sent once,
// unless the answer says x-should-retry: true or the call is said to be
// safe to repeat (PolicySafeToRepeat), when it is asked again with the
// same body.
func TestAnthropicOverloaded(t *testing.T) {
	t.Parallel()
	safe := retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicySafeToRepeat())
	msg := func(ctx context.Context) func(anthropic.Client) error {
		return func(c anthropic.Client) error { return message(ctx, c) }
	}
	for _, tc := range []struct {
		name   string
		script []reply
		call   func(anthropic.Client) error
		hits   string // what the stub answered
	}{
		{"Models.List, 529 every time", []reply{anthropicOverloaded}, anthropicModelsList, "[529 529 529]"},
		{"Models.List, 529 once", []reply{anthropicOverloaded, anthropicModels}, anthropicModelsList, "[529 200]"},
		{"Messages.New, 529", []reply{anthropicOverloaded, anthropicMessage}, msg(context.Background()), "[529]"},
		{"Messages.New, 529 x-should-retry: true", []reply{anthropicError(529, "overloaded_error", "x-should-retry", "true"), anthropicMessage},
			msg(context.Background()), "[529 200]"},
		{"Messages.New, 529, PolicySafeToRepeat", []reply{anthropicOverloaded, anthropicMessage}, msg(safe), "[529 200]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.script...))
				err := tc.call(anthropicAt(url, fast(base)))
				hits := rec.Hits()
				if got := statuses(hits); got != tc.hits {
					t.Errorf("the stub answered %s, want %s", got, tc.hits)
				}
				if strings.HasSuffix(tc.hits, "200]") {
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(hits[0].Body, hits[1].Body) {
						t.Errorf("the retry's body differs from the first's")
					}
					return
				}
				checkAnthropicError(t, err, 529)
			})
		})
	}
}

// TestAnthropicWaitsNamed proves that the waits Anthropic names are
// obeyed on Messages.New (a 429 says the server did nothing, so the POST
// is asked again): retry-after: 3, and a spent quota of requests or input
// tokens with its reset as an RFC 3339 time 3 s away (counted from the
// answer's Date), each wait 3 s.
func TestAnthropicWaitsNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header func(now time.Time) []string
	}{
		{"retry-after: 3", func(time.Time) []string { return []string{"retry-after", "3"} }},
		{"requests spent", func(now time.Time) []string {
			return []string{"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0",
				"anthropic-ratelimit-requests-reset", now.Add(3 * time.Second).UTC().Format(time.RFC3339)}
		}},
		{"input tokens spent", func(now time.Time) []string {
			return []string{"anthropic-ratelimit-requests-remaining", "49", "anthropic-ratelimit-input-tokens-remaining", "0",
				"anthropic-ratelimit-input-tokens-reset", now.Add(3 * time.Second).UTC().Format(time.RFC3339)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				rec, url, base := bubbleStub(t, replies(anthropicError(429, "rate_limit_error", tc.header(start)...), anthropicMessage))
				if err := message(context.Background(), anthropicAt(url, fast(base))); err != nil {
					t.Fatal(err)
				}
				if hits := rec.Hits(); len(hits) != 2 || time.Since(start) != 3*time.Second {
					t.Errorf("the stub answered %s in %v, want 2 requests 3 s apart", statuses(hits), time.Since(start))
				}
			})
		})
	}
}

// TestAnthropicWaitHandedBack proves that a retry-after beyond 60 s comes
// back at once as the *anthropic.Error of the 429, after one request, and
// that the next call fails with ErrHostPaused without a request.
func TestAnthropicWaitHandedBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(anthropicError(429, "rate_limit_error", "retry-after", "120")))
		c := anthropicAt(url, fast(base))
		checkAnthropicError(t, message(context.Background(), c), 429)
		nextCallParked(t, rec, "Messages.New", func() error { return message(context.Background(), c) })
	})
}

// TestAnthropicShouldRetryFalse proves that x-should-retry: false is
// final: a 500 on Models.List (a GET, otherwise asked again) reaches the
// stub once and comes back as an *anthropic.Error.
func TestAnthropicShouldRetryFalse(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(anthropicError(500, "api_error", "x-should-retry", "false")))
		checkAnthropicError(t, anthropicModelsList(anthropicAt(url, fast(base))), 500)
		if hits := rec.Hits(); len(hits) != 1 {
			t.Errorf("the stub answered %s, want one 500", statuses(hits))
		}
	})
}

// TestAnthropicSDKRetriesMultiply proves what leaving anthropic-sdk-go's
// retries on (2 by default) costs under retryhttp on a host that fails
// every time: a 529 on Messages.New, 3 (the SDK resends it, retryhttp does
// not); a 429 with retry-after: 1, 3 × 3 = 9; a 529 on Models.List, 9.
func TestAnthropicSDKRetriesMultiply(t *testing.T) {
	t.Parallel()
	msg := func(c anthropic.Client) error { return message(context.Background(), c) }
	for _, tc := range []struct {
		name    string
		answer  reply
		call    func(anthropic.Client) error
		off, on int
	}{
		{"Messages.New, 529", anthropicOverloaded, msg, 1, 3},
		{"Messages.New, 429 retry-after: 1", anthropicError(429, "rate_limit_error", "retry-after", "1"), msg, 3, 9},
		{"Models.List, 529", anthropicOverloaded, anthropicModelsList, 3, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, on := range []bool{false, true} {
				synctest.Test(t, func(t *testing.T) {
					rec, url, base := bubbleStub(t, replies(tc.answer))
					c, want := anthropicAt(url, layered(base)), tc.off
					if on {
						c, want = anthropicAt(url, layered(base), anthropicopt.WithMaxRetries(2)), tc.on
					}
					checkAnthropicError(t, tc.call(c), tc.answer.status)
					if hits := rec.Hits(); len(hits) != want {
						t.Errorf("anthropic-sdk-go retries on: %v: the stub saw %d requests, want %d", on, len(hits), want)
					}
				})
			}
		})
	}
}
