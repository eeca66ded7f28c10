package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/slack-go/slack"
)

var (
	slackPosted    = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"}, `{"ok": true, "channel": "C1", "ts": "1.2"}`}
	slackPermalink = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"}, `{"ok": true, "channel": "C1", "permalink": "https://example.slack.com/p1"}`}
	slackLimited   = reply{http.StatusTooManyRequests, map[string]string{"Content-Type": "application/json", "Retry-After": "1"}, `{"ok": false, "error": "ratelimited"}`}
	slackDown      = reply{http.StatusServiceUnavailable, map[string]string{"Content-Type": "text/html"}, "<html>503</html>"}
)

func slackAt(url string, hc *http.Client, opts ...slack.Option) *slack.Client {
	c := newSlack("xoxb-local", url+"/api/", hc)
	for _, o := range opts {
		o(c)
	}
	return c
}

func postMessage(c *slack.Client) error {
	_, _, err := c.PostMessageContext(context.Background(), "C1", slack.MsgOptionText("hello", false))
	return err
}

// TestSlackRateLimitAbsorbed proves that a 429 with Retry-After: 1 that
// retryhttp absorbs is invisible to the caller of chat.postMessage, a POST:
// a 429 says the server did nothing, so any method is asked again.
func TestSlackRateLimitAbsorbed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(slackLimited, slackPosted))
		start := time.Now()
		if err := postMessage(slackAt(url, fast(base))); err != nil {
			t.Fatal(err)
		}
		hits := rec.Hits()
		if len(hits) != 2 || time.Since(start) < time.Second {
			t.Errorf("the stub answered %s in %v, want 2 requests a second apart", statuses(hits), time.Since(start))
		}
		if len(hits) == 2 && !bytes.Equal(hits[0].Body, hits[1].Body) {
			t.Errorf("the retry's form %q differs from the first's %q", hits[1].Body, hits[0].Body)
		}
	})
}

// TestSlackRateLimitHandedBack proves what the caller gets when retryhttp
// gives up on a 429: a *slack.RateLimitedError with the Retry-After, after
// three tries or at once when it is beyond 60 s (and then ErrHostPaused,
// without a request sent, while the host is parked); a 429 without
// Retry-After comes back, after three tries, as a slack.StatusCodeError.
func TestSlackRateLimitHandedBack(t *testing.T) {
	t.Parallel()
	noWait := slackLimited
	noWait.header = map[string]string{"Content-Type": "application/json"}
	for _, tc := range []struct {
		name       string
		answer     reply
		hits       int
		retryAfter time.Duration // of the RateLimitedError; 0: a StatusCodeError
	}{
		{"429 Retry-After: 1 every time", slackLimited, 3, time.Second},
		{"429 Retry-After: 120", withHeader(slackLimited, "Retry-After", "120"), 1, 120 * time.Second},
		{"429 without Retry-After every time", noWait, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.answer))
				c := slackAt(url, fast(base))
				err := postMessage(c)
				var limited *slack.RateLimitedError
				var status slack.StatusCodeError
				switch {
				case tc.retryAfter != 0 && (!errors.As(err, &limited) || limited.RetryAfter != tc.retryAfter):
					t.Errorf("err = %v, want a RateLimitedError after %v", err, tc.retryAfter)
				case tc.retryAfter == 0 && (!errors.As(err, &status) || status.Code != http.StatusTooManyRequests):
					t.Errorf("err = %v (%T), want a StatusCodeError 429", err, err)
				}
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
				if tc.hits != 1 {
					return
				}
				nextCallParked(t, rec, "call", func() error { return postMessage(c) })
			})
		})
	}
}

// TestSlackServerErrors proves that a 5xx is asked again only for the few
// methods slack-go sends as GET (chat.getPermalink): nearly every method,
// chat.postMessage among them, is a POST without an idempotency key, which
// retryhttp sends once, as the server may have acted on it. The caller
// gets a slack.StatusCodeError.
func TestSlackServerErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		call func(*slack.Client) error
		hits int
	}{
		{"chat.postMessage", postMessage, 1},
		{"chat.getPermalink", func(c *slack.Client) error {
			_, err := c.GetPermalinkContext(context.Background(), &slack.PermalinkParameters{Channel: "C1", Ts: "1.2"})
			return err
		}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(slackDown))
				err := tc.call(slackAt(url, fast(base)))
				var status slack.StatusCodeError
				if !errors.As(err, &status) || status.Code != http.StatusServiceUnavailable {
					t.Errorf("err = %v (%T), want a StatusCodeError 503", err, err)
				}
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
			})
		})
	}
	// The 503 is handed back as it is; the GET succeeds once the host does.
	synctest.Test(t, func(t *testing.T) {
		_, url, base := bubbleStub(t, replies(slackDown, slackPermalink))
		link, err := slackAt(url, fast(base)).GetPermalinkContext(context.Background(), &slack.PermalinkParameters{Channel: "C1", Ts: "1.2"})
		if err != nil || link == "" {
			t.Errorf("GetPermalink after a 503: %q, %v", link, err)
		}
	})
}

// TestSlackRetries proves what turning slack-go's retries on
// (OptionRetry(3), after OptionHTTPClient) costs under retryhttp: it
// retries 429s only, 4 × 3 = 12 requests on a host that limits every
// time, against 3 without it; a 503 on a POST stays one request either way.
func TestSlackRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answer  reply
		off, on int
	}{
		{"429 Retry-After: 1 every time", slackLimited, 3, 12},
		{"503 every time", slackDown, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, on := range []bool{false, true} {
				synctest.Test(t, func(t *testing.T) {
					rec, url, base := bubbleStub(t, replies(tc.answer))
					c, want := slackAt(url, fast(base)), tc.off
					if on {
						c, want = slackAt(url, fast(base), slack.OptionRetry(3)), tc.on
					}
					if err := postMessage(c); err == nil {
						t.Error("postMessage succeeded")
					}
					if hits := rec.Hits(); len(hits) != want {
						t.Errorf("slack-go retries on: %v: the stub saw %d requests, want %d", on, len(hits), want)
					}
				})
			}
		})
	}
}

// TestSlackFileUpload proves what happens to the upload step of
// UploadFileContext, a POST whose multipart body slack-go streams through a
// pipe (no GetBody, no length): a 429 with Retry-After: 1 is absorbed, the
// retry carrying the same bytes, replayed by retryhttp from what the base
// transport read; a 503 is handed back after one request.
func TestSlackFileUpload(t *testing.T) {
	t.Parallel()
	content := strings.Repeat("0123456789abcdef", 4<<10) // 64 KiB
	for _, tc := range []struct {
		name    string
		upload  []reply
		uploads int
		ok      bool
	}{
		{"429 Retry-After: 1 then 200", []reply{slackLimited, {status: http.StatusOK}}, 2, true},
		{"503", []reply{slackDown}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				uploads := 0
				var url string
				rec, url, base := bubbleStub(t, func(_ int, r *http.Request, _ []byte) reply {
					switch r.URL.Path {
					case "/api/files.getUploadURLExternal":
						return reply{http.StatusOK, nil, `{"ok": true, "upload_url": "` + url + `/upload/F1", "file_id": "F1"}`}
					case "/upload/F1":
						uploads++
						return tc.upload[min(uploads, len(tc.upload))-1]
					default:
						return reply{http.StatusOK, nil, `{"ok": true, "files": [{"id": "F1", "title": "t"}]}`}
					}
				})
				_, err := slackAt(url, fast(base)).UploadFileContext(context.Background(), slack.UploadFileParameters{
					Filename: "data.txt", FileSize: len(content), Content: content, Channel: "C1",
				})
				if (err == nil) != tc.ok {
					t.Fatalf("UploadFile: %v, want success %v", err, tc.ok)
				}
				var sent [][]byte
				for _, h := range rec.Hits() {
					if h.Path != "/upload/F1" {
						continue
					}
					sent = append(sent, h.Body)
					if got, err := multipartFile(h); err != nil || got != content {
						t.Errorf("an upload carried %d bytes of file, not the caller's %d (%v)", len(got), len(content), err)
					}
				}
				if len(sent) != tc.uploads {
					t.Fatalf("%d uploads reached the stub, want %d", len(sent), tc.uploads)
				}
				if len(sent) == 2 && !bytes.Equal(sent[0], sent[1]) {
					t.Errorf("the upload's retry differs from its first try: %d bytes, then %d", len(sent[0]), len(sent[1]))
				}
			})
		})
	}
}

// multipartFile returns the file part of an upload.
func multipartFile(h hit) (string, error) {
	_, params, err := mime.ParseMediaType(h.Header.Get("Content-Type"))
	if err != nil {
		return "", err
	}
	mr := multipart.NewReader(bytes.NewReader(h.Body), params["boundary"])
	for {
		p, err := mr.NextPart()
		if err != nil {
			return "", err
		}
		if p.FormName() == "file" {
			b, err := io.ReadAll(p)
			return string(b), err
		}
	}
}
