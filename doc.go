// Package retryhttp makes any http.Client polite and resilient. Its
// Transport is an http.RoundTripper that
//
//   - retries only what can succeed (408, 429, 500, 502, 503, 504 and
//     transient network errors) and only what is safe to repeat (idempotent
//     methods, requests with an Idempotency-Key, and requests the server
//     certainly never saw);
//   - rewinds request bodies with GetBody or by seeking, and replays any
//     other body from a bounded copy (256 KiB) of what the base read, once
//     the base has closed it;
//   - obeys Retry-After and rate-limit headers within bounds (a floor of
//     1 s, a max of 60 s), counting dates from the server's own clock;
//   - parks a host that asked for a wait, so that every request through the
//     Transport waits or fails fast instead of hammering it;
//   - paces each host at the quota it announces, below the rate it refused,
//     and within a configured pace when asked;
//   - caps retries at 10 % of first tries with a client-wide budget, so an
//     outage is not multiplied by the retry count;
//   - honours the request's context in every wait, takes a policy of its
//     own for one request from its context (ContextWithPolicy), and says
//     what it did through hooks, log/slog and ResendCount on each try's
//     context.
//
// The zero configuration is the safe one:
//
//	client := &http.Client{Transport: retryhttp.New()}
//
// The package starts no goroutine, keeps no global state, and can run
// inside a testing/synctest bubble, where its waits take no real time.
package retryhttp
