package retryhttp

// Idempotency keys: those WithAutoIdempotencyKey adds are UUID v4, one per
// request and the same on each of its retries, and a key the caller set
// is kept. Issue 4.

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var relUUIDv4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestReliabilityIdempotencyKeys: the keys WithAutoIdempotencyKey adds are
// UUID v4 from crypto/rand, one per request, the same on every retry of
// it, never one the caller already set, and the caller's request is left
// alone.
func TestReliabilityIdempotencyKeys(t *testing.T) {
	t.Run("format and uniqueness", func(t *testing.T) {
		const n = 20_000
		seen := make(map[string]bool, n)
		for range n {
			k := newIdempotencyKey()
			if !relUUIDv4.MatchString(k) {
				t.Fatalf("key %q is not a UUID v4", k)
			}
			if seen[k] {
				t.Fatalf("key %q made twice", k)
			}
			seen[k] = true
		}
	})
	t.Run("through the Transport", func(t *testing.T) {
		var (
			mu   sync.Mutex
			keys = make(map[string][]string) // request id -> key of each try
		)
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			id := r.Header.Get("X-Rel-Id")
			mu.Lock()
			keys[id] = append(keys[id], r.Header.Get("Idempotency-Key"))
			tries := len(keys[id])
			mu.Unlock()
			if r.Body != nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
			if tries < 3 {
				return relResponse(r, http.StatusServiceUnavailable, nil, nil, 0), nil
			}
			return relResponse(r, http.StatusOK, nil, nil, 0), nil
		})
		tr := New(WithBase(base), WithAutoIdempotencyKey(), WithBudget(nil), WithLearning(false),
			WithBackoff(time.Nanosecond, time.Nanosecond))
		const workers, each = 20, 50
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					method := http.MethodPost
					if i%2 == 1 {
						method = http.MethodPatch
					}
					req, _ := http.NewRequest(method, "http://keys.test/", strings.NewReader("body"))
					req.Header.Set("X-Rel-Id", fmt.Sprintf("%d-%d", w, i))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if len(req.Header) != 1 {
						t.Errorf("the caller's request was changed: %v", req.Header)
					}
				}
			})
		}
		wg.Wait()
		distinct := make(map[string]bool)
		for id, ks := range keys {
			if len(ks) != 3 || ks[0] != ks[1] || ks[1] != ks[2] || !relUUIDv4.MatchString(ks[0]) {
				t.Fatalf("request %s sent keys %q, want one UUID v4 three times", id, ks)
			}
			distinct[ks[0]] = true
		}
		if len(distinct) != workers*each {
			t.Errorf("%d distinct keys for %d requests", len(distinct), workers*each)
		}
	})
	t.Run("the caller's key is kept", func(t *testing.T) {
		for _, h := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
			var got []string
			base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
				got = append(got, r.Header.Get("Idempotency-Key")+"|"+r.Header.Get("X-Idempotency-Key"))
				return relResponse(r, http.StatusOK, nil, nil, 0), nil
			})
			tr := New(WithBase(base), WithAutoIdempotencyKey())
			req, _ := http.NewRequest(http.MethodPost, "http://keys.test/", strings.NewReader("b"))
			req.Header.Set(h, "mine")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := "mine|"
			if h != "Idempotency-Key" {
				want = "|mine"
			}
			if diff := cmp.Diff([]string{want}, got); diff != "" {
				t.Errorf("%s: keys sent (-want +got):\n%s", h, diff)
			}
		}
	})
}
