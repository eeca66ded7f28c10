package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-github/v93/github"
)

// GitHub's REST API says "rate limited" with a 403 (or a 429): the primary
// limit with x-ratelimit-remaining: 0 and x-ratelimit-reset in epoch
// seconds, the secondary one with a Retry-After and a documentation_url.

const (
	githubPrimaryBody   = `{"message": "API rate limit exceeded for user ID 1.", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}`
	githubSecondaryBody = `{"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`
)

var (
	githubIssues = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"}, `[{"number": 1, "title": "first"}]`}
	githubIssue  = reply{http.StatusCreated, map[string]string{"Content-Type": "application/json"}, `{"number": 2, "title": "new"}`}
)

// githubPrimary is GitHub's answer once the primary rate limit is spent,
// until a reset d after now (the stub's clock, which its Date header
// carries too).
func githubPrimary(status int, now time.Time, d time.Duration) reply {
	return reply{status, map[string]string{
		"Content-Type":          "application/json",
		"X-RateLimit-Limit":     "5000",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Used":      "5000",
		"X-RateLimit-Reset":     strconv.FormatInt(now.Add(d).Unix(), 10),
		"X-RateLimit-Resource":  "core",
	}, githubPrimaryBody}
}

func githubSecondary(retryAfter string) reply {
	return reply{http.StatusForbidden, map[string]string{"Content-Type": "application/json", "Retry-After": retryAfter}, githubSecondaryBody}
}

func githubAt(t *testing.T, url string, hc *http.Client) *github.Client {
	t.Helper()
	c, err := newGitHub(url+"/", hc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func listIssues(c *github.Client) error {
	_, _, err := c.Issues.ListByRepo(context.Background(), "o", "r", nil)
	return err
}

func createIssue(c *github.Client) error {
	_, _, err := c.Issues.Create(context.Background(), "o", "r", github.CreateIssueRequest{Title: "new"})
	return err
}

// TestGitHubPrimaryRateLimit proves that the primary rate limit, a 403 or
// a 429 with x-ratelimit-remaining: 0 and a reset 2 s away, is waited out
// and the call succeeds, Issues.Create (a POST) included, since a rate
// limit says GitHub did nothing; with the reset an hour away the caller
// gets *github.RateLimitError at once, after one request, and the next call
// too, from go-github's own memory of the limit, without a request.
func TestGitHubPrimaryRateLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		call   func(*github.Client) error
		ok     reply
	}{
		{"ListByRepo, 403", http.StatusForbidden, listIssues, githubIssues},
		{"ListByRepo, 429", http.StatusTooManyRequests, listIssues, githubIssues},
		{"Create, 403", http.StatusForbidden, createIssue, githubIssue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				rec, url, base := bubbleStub(t, replies(githubPrimary(tc.status, start, 2*time.Second), tc.ok))
				if err := tc.call(githubAt(t, url, fast(base))); err != nil {
					t.Fatal(err)
				}
				hits := rec.Hits()
				if len(hits) != 2 || time.Since(start) != 2*time.Second {
					t.Errorf("the stub answered %s in %v, want 2 requests 2 s apart", statuses(hits), time.Since(start))
				}
				if len(hits) == 2 && !bytes.Equal(hits[0].Body, hits[1].Body) {
					t.Errorf("the retry's body %q differs from the first's %q", hits[1].Body, hits[0].Body)
				}
			})
		})
	}
	t.Run("reset an hour away", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(githubPrimary(http.StatusForbidden, time.Now(), time.Hour)))
			c := githubAt(t, url, fast(base))
			for i := range 2 {
				var rle *github.RateLimitError
				if err := listIssues(c); !errors.As(err, &rle) || rle.Rate.Remaining != 0 {
					t.Errorf("call %d: err = %v (%T), want a *github.RateLimitError", i+1, err, err)
				}
			}
			if hits := rec.Hits(); len(hits) != 1 {
				t.Errorf("the stub answered %s, want one 403", statuses(hits))
			}
		})
	})
}

// TestGitHubSecondaryRateLimit proves that the secondary rate limit, a 403
// with Retry-After: 3, is waited out, even on Issues.Create, a POST; with
// Retry-After: 120 the caller gets *github.AbuseRateLimitError at once,
// with its RetryAfter, and the next call gets it too, from go-github's own
// memory, without a request.
func TestGitHubSecondaryRateLimit(t *testing.T) {
	t.Parallel()
	t.Run("Retry-After: 3", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(githubSecondary("3"), githubIssue))
			start := time.Now()
			if err := createIssue(githubAt(t, url, fast(base))); err != nil {
				t.Fatal(err)
			}
			if hits := rec.Hits(); len(hits) != 2 || time.Since(start) != 3*time.Second {
				t.Errorf("the stub answered %s in %v, want 2 requests 3 s apart", statuses(hits), time.Since(start))
			}
		})
	})
	t.Run("Retry-After: 120", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(githubSecondary("120")))
			c := githubAt(t, url, fast(base))
			for i := range 2 {
				var are *github.AbuseRateLimitError
				if err := createIssue(c); !errors.As(err, &are) || are.RetryAfter == nil || *are.RetryAfter > 120*time.Second {
					t.Errorf("call %d: err = %v (%T), want a *github.AbuseRateLimitError with its RetryAfter", i+1, err, err)
				}
			}
			if hits := rec.Hits(); len(hits) != 1 {
				t.Errorf("the stub answered %s, want one 403", statuses(hits))
			}
		})
	})
}

// TestGitHubForbidden proves that a 403 that is not a rate limit (no
// rate-limit headers, or seed 000's Retry-After: 0) reaches the stub once
// and comes back as a *github.ErrorResponse with its status.
func TestGitHubForbidden(t *testing.T) {
	t.Parallel()
	for _, answer := range []reply{
		{http.StatusForbidden, map[string]string{"Content-Type": "application/json"}, `{"message": "Must have admin rights to Repository."}`},
		{http.StatusForbidden, map[string]string{"Retry-After": "0"}, ""},
	} {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(answer))
			var er *github.ErrorResponse
			if err := listIssues(githubAt(t, url, fast(base))); !errors.As(err, &er) || er.Response.StatusCode != 403 {
				t.Errorf("err = %v (%T), want a *github.ErrorResponse 403", err, err)
			}
			if hits := rec.Hits(); len(hits) != 1 {
				t.Errorf("the stub answered %s, want one 403", statuses(hits))
			}
		})
	}
}

// TestGitHubServerErrors proves that a 502 is asked again on a GET (3
// tries) and sent once on Issues.Create, a POST GitHub may have acted on.
func TestGitHubServerErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		call func(*github.Client) error
		hits int
	}{
		{"ListByRepo", listIssues, 3},
		{"Create", createIssue, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(reply{status: http.StatusBadGateway, body: "<html>502</html>"}))
				var er *github.ErrorResponse
				if err := tc.call(githubAt(t, url, fast(base))); !errors.As(err, &er) || er.Response.StatusCode != 502 {
					t.Errorf("err = %v (%T), want a *github.ErrorResponse 502", err, err)
				}
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
			})
		})
	}
}

// TestGitHubSleepUntilReset proves why the context must not carry
// github.SleepUntilPrimaryRateLimitResetWhenRateLimited: with it, a reset
// an hour away makes go-github sleep that hour (plus its second of
// buffer) and ask again, where without it retryhttp hands the
// *github.RateLimitError back at once.
func TestGitHubSleepUntilReset(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		rec, url, base := bubbleStub(t, replies(githubPrimary(http.StatusForbidden, start, time.Hour), githubIssues))
		ctx := context.WithValue(context.Background(), github.SleepUntilPrimaryRateLimitResetWhenRateLimited, true)
		if _, _, err := githubAt(t, url, fast(base)).Issues.ListByRepo(ctx, "o", "r", nil); err != nil {
			t.Fatal(err)
		}
		if hits := rec.Hits(); len(hits) != 2 || time.Since(start) < time.Hour {
			t.Errorf("the stub answered %s in %v, want 2 requests an hour apart", statuses(hits), time.Since(start))
		}
	})
}
