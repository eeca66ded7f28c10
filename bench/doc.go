// Package bench compares retryhttp with its peers, side by side, in one
// `go test -bench` run: hashicorp/go-retryablehttp, failsafe-go's
// failsafehttp, PuerkitoBio/rehttp, and a bare pooled *http.Transport.
//
// It is a module of its own so that the peers stay out of the core's
// go.mod. Everything lives in the _test.go files: peers_test.go configures
// each library and the two bases (an in-memory RoundTripper and a loopback
// httptest.Server) and checks that every case works with every library;
// bench_test.go holds the benchmarks. limiters_test.go runs 30 workers
// against real rate-limiting middlewares (go-chi/httprate, throttled) on a
// virtual clock, every library with its default options. README.md says how
// to run them and what they found.
package bench
