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

	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"github.com/retryhttp/retryhttp"
)

func openAIError(status int, code string, header ...string) reply {
	h := map[string]string{"Content-Type": "application/json"}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return reply{status, h, `{"error": {"message": "stub says ` + http.StatusText(status) + `", "type": "` + code + `", "param": null, "code": "` + code + `"}}`}
}

var (
	openAIChat = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"},
		`{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
		  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}`}
	openAIModels = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"},
		`{"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model", "created": 1, "owned_by": "openai"}]}`}
	openAIFile = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"},
		`{"id": "file-1", "object": "file", "bytes": 65536, "created_at": 1, "filename": "train.jsonl", "purpose": "fine-tune", "status": "processed"}`}
)

func openAIAt(url string, hc *http.Client, opts ...openaiopt.RequestOption) openai.Client {
	return newOpenAI(url+"/v1/", hc, opts...)
}

func chat(ctx context.Context, c openai.Client) (*openai.ChatCompletion, error) {
	return c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "gpt-4.1", // any model name: the stub answers every one
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
}

func listModels(c openai.Client) error {
	_, err := c.Models.List(context.Background())
	return err
}

// checkOpenAIError fails t unless err is the *openai.Error of an answer
// with this status.
func checkOpenAIError(t *testing.T, err error, status int) {
	t.Helper()
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != status {
		t.Errorf("err = %v (%T), want an *openai.Error %d", err, err, status)
	}
}

// TestOpenAIWaitsNamed proves that the waits OpenAI names are obeyed, on a
// chat completion (a POST, asked again after a 429 since the server did
// nothing) and on a GET answered 503: retry-after-ms: 3000 beside
// Retry-After: 1 waits 3 s, as openai-go itself would; a spent quota of
// requests or of tokens (x-ratelimit-remaining-*: 0) waits for its
// x-ratelimit-reset-*.
func TestOpenAIWaitsNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer reply
		call   func(openai.Client) error
		ok     reply
	}{
		{"chat, 429 retry-after-ms 3000 beside Retry-After 1", openAIError(429, "rate_limit_exceeded", "retry-after-ms", "3000", "Retry-After", "1"),
			func(c openai.Client) error { _, err := chat(context.Background(), c); return err }, openAIChat},
		{"chat, 429 requests spent, reset 3s", openAIError(429, "rate_limit_exceeded",
			"x-ratelimit-limit-requests", "500", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "3s"),
			func(c openai.Client) error { _, err := chat(context.Background(), c); return err }, openAIChat},
		{"chat, 429 tokens spent, reset 3s", openAIError(429, "rate_limit_exceeded",
			"x-ratelimit-remaining-requests", "499", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "3s"),
			func(c openai.Client) error { _, err := chat(context.Background(), c); return err }, openAIChat},
		{"models, 503 retry-after-ms 3000", openAIError(503, "server_error", "retry-after-ms", "3000"), listModels, openAIModels},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.answer, tc.ok))
				start := time.Now()
				if err := tc.call(openAIAt(url, fast(base))); err != nil {
					t.Fatal(err)
				}
				if hits := rec.Hits(); len(hits) != 2 || time.Since(start) != 3*time.Second {
					t.Errorf("the stub answered %s in %v, want 2 requests 3 s apart", statuses(hits), time.Since(start))
				}
			})
		})
	}
}

// TestOpenAIWaitHandedBack proves that a wait beyond retryhttp's max (60 s)
// comes back at once as the *openai.Error of the 429, after one request,
// and that the next call fails with ErrHostPaused without a request.
func TestOpenAIWaitHandedBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(openAIError(429, "rate_limit_exceeded", "retry-after-ms", "120000")))
		c := openAIAt(url, fast(base))
		start := time.Now()
		_, err := chat(context.Background(), c)
		checkOpenAIError(t, err, 429)
		if hits := rec.Hits(); len(hits) != 1 || time.Since(start) != 0 {
			t.Errorf("the stub answered %s in %v, want one 429 at once", statuses(hits), time.Since(start))
		}
		nextCallParked(t, rec, "chat completion", func() error { _, err := chat(context.Background(), c); return err })
	})
}

// TestOpenAIShouldRetry proves that x-should-retry is the server's word:
// "false" on a 500 is final, even on a GET, and the caller gets the
// *openai.Error; "true" on a 409 asks again, even for a chat completion (a
// POST), since the server vouches that repeating it is harmless.
func TestOpenAIShouldRetry(t *testing.T) {
	t.Parallel()
	t.Run("false on a 500 GET", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(openAIError(500, "server_error", "x-should-retry", "false")))
			checkOpenAIError(t, listModels(openAIAt(url, fast(base))), 500)
			if hits := rec.Hits(); len(hits) != 1 {
				t.Errorf("the stub answered %s, want one 500", statuses(hits))
			}
		})
	})
	t.Run("true on a 409 POST", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(openAIError(409, "conflict", "x-should-retry", "true"), openAIChat))
			if _, err := chat(context.Background(), openAIAt(url, fast(base))); err != nil {
				t.Fatal(err)
			}
			if hits := rec.Hits(); len(hits) != 2 || !bytes.Equal(hits[0].Body, hits[1].Body) {
				t.Errorf("the stub answered %s, want 2 requests with the same body", statuses(hits))
			}
		})
	})
}

// openAICompletions picks the requests of a chat completion: POSTs that
// are safe to repeat for an application that can pay for a completion
// twice.
func openAICompletions(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/chat/completions")
}

// TestOpenAIServerErrorOnChat proves what a 500 or 503 on a chat completion
// costs: it is a POST without an idempotency key (openai-go sends none),
// which the server may have
// acted on, so it is sent once and the caller gets the *openai.Error; said
// to be safe to repeat (retryhttp.PolicySafeToRepeat on the call's context,
// or retryhttp.WithSafeToRepeat for the client's completions), it is asked
// again with the same body and succeeds.
func TestOpenAIServerErrorOnChat(t *testing.T) {
	t.Parallel()
	safe := retryhttp.ContextWithPolicy(context.Background(), retryhttp.PolicySafeToRepeat())
	for _, tc := range []struct {
		name   string
		status int
		ctx    context.Context
		opts   []retryhttp.Option
		hits   int
	}{
		{"500, unsaid", 500, context.Background(), nil, 1},
		{"503, unsaid", 503, context.Background(), nil, 1},
		{"500, PolicySafeToRepeat", 500, safe, nil, 2},
		{"503, WithSafeToRepeat", 503, context.Background(), []retryhttp.Option{retryhttp.WithSafeToRepeat(openAICompletions)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(openAIError(tc.status, "server_error"), openAIChat))
				_, err := chat(tc.ctx, openAIAt(url, fast(base, tc.opts...)))
				hits := rec.Hits()
				if len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
				if key := hits[0].Header.Get("Idempotency-Key"); key != "" {
					t.Errorf("openai-go sent Idempotency-Key %q", key)
				}
				if tc.hits == 1 {
					checkOpenAIError(t, err, tc.status)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(hits[0].Body, hits[1].Body) {
					t.Errorf("the retry's body %q differs from the first's %q", hits[1].Body, hits[0].Body)
				}
			})
		})
	}
}

// TestOpenAIRetryCountHeader proves a surprise of openai-go with its
// retries off: it sends X-Stainless-Retry-Count: 0 on every attempt,
// retryhttp's retries included, since it sets the header once per call.
// Count retries with retryhttp.ResendCount or the hooks instead.
func TestOpenAIRetryCountHeader(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(openAIError(429, "rate_limit_exceeded", "Retry-After", "1"), openAIChat))
		if _, err := chat(context.Background(), openAIAt(url, fast(base))); err != nil {
			t.Fatal(err)
		}
		var counts []string
		for _, h := range rec.Hits() {
			counts = append(counts, h.Header.Get("X-Stainless-Retry-Count"))
		}
		if strings.Join(counts, " ") != "0 0" {
			t.Errorf("X-Stainless-Retry-Count %q, want 0 on both attempts", counts)
		}
	})
}

// TestOpenAIFileUpload proves that Files.New, whose multipart body
// openai-go builds in memory and hands over with GetBody, is asked again
// after a 429 with the same bytes, whatever its size (here above
// retryhttp's replay limit, which GetBody does not need), and sent once on
// a 503 (a POST).
func TestOpenAIFileUpload(t *testing.T) {
	t.Parallel()
	content := strings.Repeat(`{"messages": []}`+"\n", 20<<10) // 340 KiB, above the replay limit
	for _, tc := range []struct {
		name   string
		answer reply
		hits   int
	}{
		{"429 Retry-After: 1, then 200", openAIError(429, "rate_limit_exceeded", "Retry-After", "1"), 2},
		{"503", openAIError(503, "server_error"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.answer, openAIFile))
				c := openAIAt(url, fast(base))
				_, err := c.Files.New(context.Background(), openai.FileNewParams{
					File:    openai.File(strings.NewReader(content), "train.jsonl", "application/jsonl"),
					Purpose: openai.FilePurposeFineTune,
				})
				hits := rec.Hits()
				if len(hits) != tc.hits || (err == nil) != (tc.hits == 2) {
					t.Fatalf("the stub answered %s, err %v; want %d requests", statuses(hits), err, tc.hits)
				}
				for i, h := range hits {
					if got, err := multipartFile(h); err != nil || got != content {
						t.Errorf("attempt %d carried %d bytes of file, not the caller's %d (%v)", i+1, len(got), len(content), err)
					}
				}
				if len(hits) == 2 && !bytes.Equal(hits[0].Body, hits[1].Body) {
					t.Errorf("the retry's body differs from the first's")
				}
			})
		})
	}
}

// TestOpenAISDKRetriesMultiply proves what leaving openai-go's retries on
// (2 by default) costs under retryhttp on a host that fails every time: a
// 429 on a chat completion, 3 × 3 = 9 requests; a 500 on a chat
// completion, 3 (openai-go resends POSTs, retryhttp does not); a 500 on a
// GET, 9.
func TestOpenAISDKRetriesMultiply(t *testing.T) {
	t.Parallel()
	chatCall := func(c openai.Client) error { _, err := chat(context.Background(), c); return err }
	for _, tc := range []struct {
		name    string
		answer  reply
		call    func(openai.Client) error
		off, on int
	}{
		{"chat, 429 Retry-After: 1", openAIError(429, "rate_limit_exceeded", "Retry-After", "1"), chatCall, 3, 9},
		{"chat, 500", openAIError(500, "server_error"), chatCall, 1, 3},
		{"models, 500", openAIError(500, "server_error"), listModels, 3, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, on := range []bool{false, true} {
				synctest.Test(t, func(t *testing.T) {
					rec, url, base := bubbleStub(t, replies(tc.answer))
					c, want := openAIAt(url, fast(base)), tc.off
					if on {
						c, want = openAIAt(url, fast(base), openaiopt.WithMaxRetries(2)), tc.on
					}
					checkOpenAIError(t, tc.call(c), tc.answer.status)
					if hits := rec.Hits(); len(hits) != want {
						t.Errorf("openai-go retries on: %v: the stub saw %d requests, want %d", on, len(hits), want)
					}
				})
			}
		})
	}
}
