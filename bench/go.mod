module github.com/retryhttp/retryhttp/bench

go 1.26.0

require (
	github.com/PuerkitoBio/rehttp v1.4.0
	github.com/didip/tollbooth/v7 v7.0.2
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/go-chi/chi/v5 v5.5.0
	github.com/go-chi/httprate v0.16.1
	github.com/hashicorp/go-cleanhttp v0.5.2
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/retryhttp/retryhttp v0.0.0-00010101000000-000000000000
	github.com/throttled/throttled/v2 v2.15.0
	github.com/ulule/limiter/v3 v3.11.2
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/go-pkgz/expirable-cache/v3 v3.0.0 // indirect
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/zeebo/xxh3 v1.0.2 // indirect
	golang.org/x/sys v0.30.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace github.com/retryhttp/retryhttp => ../
