// Package bench compares retryhttp with its peers, side by side, in one
// `go test -bench` run: hashicorp/go-retryablehttp, failsafe-go's
// failsafehttp, PuerkitoBio/rehttp, and a bare pooled *http.Transport.
//
// It is a module of its own so that the peers stay out of the core's
// go.mod. Everything lives in the _test.go files: peers_test.go configures
// each library and the two bases (an in-memory RoundTripper and a loopback
// httptest.Server) and checks that every case works with every library;
// bench_test.go holds the benchmarks. limiters_test.go runs workers
// against real rate-limiting middlewares (go-chi/httprate, throttled,
// tollbooth, ulule/limiter) on a virtual clock, every library with its
// default options, and limiters_matrix_test.go does so at other worker
// counts, quotas and latencies; faults_scenarios_test.go runs them against
// servers that fail the way production ones do (a broken replica, a
// concurrency limit, an outage, a dead address, a handler that hangs).
// README.md says how to run them and what they found.
package bench
