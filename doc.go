// Package retryhttp makes any http.Client polite and resilient. Its
// Transport is an http.RoundTripper that
//
//   - retries only what can succeed (408, 429, 500, 502, 503, 504, 520-523,
//     529, a 403 that refuses for a quota, and transient network errors)
//     and only what is safe to repeat (idempotent methods, requests with an
//     Idempotency-Key, requests the server certainly never saw, and those
//     WithSafeToRepeat names);
//   - rewinds request bodies with GetBody or by seeking, and replays any
//     other body from a bounded copy (256 KiB) of what the base read, once
//     the base has closed it;
//   - obeys Retry-After, its millisecond forms and rate-limit headers
//     within bounds (a floor of 1 s, a max of 60 s), counting dates from
//     the server's own clock, and parks a host that asked for a longer
//     wait, so that every request through the Transport waits or fails
//     fast instead of hammering it;
//   - keeps a state per host from its answers: healthy; failing (retried
//     at full speed, never paced); overloaded (paced at what it accepts,
//     as a rate or a limit on what is in flight); down (requests handed
//     back at once with ErrHostDown, one probe every half second); and
//     recovering (paced at what it took before the outage). HostStatus
//     reads it;
//   - caps the retries that fail to the end at 10 % of first tries with a
//     client-wide budget, so an outage is not multiplied by the retry
//     count, while the retries of requests that succeed are refunded;
//   - bounds a hung attempt when asked (WithAttemptTimeout), and sends a
//     second attempt of a slow one that is safe to repeat (WithHedging,
//     with a fixed or a learned delay);
//   - honours the request's context in every wait, takes a policy of its
//     own for one request from its context (ContextWithPolicy), and says
//     what it did through hooks, log/slog and ResendCount on each try's
//     context.
//
// The zero configuration is the safe one:
//
//	client := &http.Client{Transport: retryhttp.New()}
//
// The package keeps no global state and starts no goroutine that outlives
// a request (a hedged request runs its first attempt on the caller's
// goroutine and its hedges on a timer's, which end with it, or, for a
// hedge that lost in flight, as soon as its cancelled base lets go); it runs inside a testing/synctest bubble, where its
// waits take no real time.
package retryhttp
