// Package retryhttp makes any http.Client polite and resilient. Its
// Transport is an http.RoundTripper that
//
//   - retries only what can succeed (408, 429, 500, 502, 503, 504 and
//     transient network errors) and only what is safe to repeat (idempotent
//     methods, requests with an Idempotency-Key, and requests the server
//     certainly never saw);
//   - rewinds request bodies with GetBody instead of buffering them;
//   - obeys Retry-After and rate-limit headers within bounds (a floor of
//     1 s, a max of 60 s), counting dates from the server's own clock;
//   - parks a host that asked for a wait, so that every request through the
//     Transport waits or fails fast instead of hammering it;
//   - paces requests per host with a token bucket, when asked;
//   - caps retries at 10 % of first tries with a client-wide budget, so an
//     outage is not multiplied by the retry count;
//   - honours the request's context in every wait, and says what it did
//     through a hook and log/slog.
//
// The zero configuration is the safe one:
//
//	client := &http.Client{Transport: retryhttp.New()}
//
// The package starts no goroutine, keeps no global state, and can run
// inside a testing/synctest bubble, where its waits take no real time.
package retryhttp
