package bench

import (
	"net/http"

	"github.com/didip/tollbooth/v7"
	"github.com/go-chi/httprate"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululestdlib "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululememory "github.com/ulule/limiter/v3/drivers/store/memory"
)

// A limMiddleware guards a handler the way a service would use it. make is
// called inside the run's bubble, so the limiter's clock is the bubble's.
type limMiddleware struct {
	name   string
	bucket bool // a token bucket (it takes a burst), not a window
	make   func(q limQuota, next http.Handler) http.Handler
}

// allowance is what the middleware lets through at once, fresh: a token
// bucket its burst, a window its limit.
func (mw limMiddleware) allowance(q limQuota) int {
	if mw.bucket {
		return q.bucket()
	}
	return q.limit
}

var limMiddlewares = []limMiddleware{
	{"httprate", false, newHTTPRate},
	{"throttled", true, newThrottled},
	{"tollbooth", true, newTollbooth},
	{"ulule", false, newUlule},
}

// newHTTPRate is go-chi/httprate v0.16.1, limit requests per window for
// everyone: LimitBy with the constant key, which is exactly what its
// (deprecated) LimitAll does; with a single client it is also what
// LimitByIP does. A sliding-window counter: it sends X-RateLimit-Limit,
// -Remaining and -Reset (the end of the current window as a Unix time) on
// every answer, and Retry-After (the window length, in seconds) on a 429.
func newHTTPRate(q limQuota, next http.Handler) http.Handler {
	return httprate.LimitBy(q.limit, q.window, httprate.Key("*"))(next)
}

// newThrottled is throttled/throttled v2.15.0: HTTPRateLimiterCtx over a
// GCRA limiter in its memstore, PerDuration(limit, window) with MaxBurst
// bucket-1 (MaxBurst counts the requests beyond the first, so a burst of
// bucket and X-RateLimit-Limit: bucket), VaryBy nil (one key for
// everyone). It sends X-RateLimit-Limit, -Remaining and -Reset (seconds
// until the bucket is full again, rounded up) on every answer, and
// Retry-After (seconds until one more request is allowed, rounded up) on a
// 429.
func newThrottled(q limQuota, next http.Handler) http.Handler {
	store, err := memstore.NewCtx(65536)
	if err != nil {
		panic(err)
	}
	limiter, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{MaxRate: throttled.PerDuration(q.limit, q.window), MaxBurst: q.bucket() - 1})
	if err != nil {
		panic(err)
	}
	h := &throttled.HTTPRateLimiterCtx{RateLimiter: limiter}
	return h.RateLimit(next)
}

// newTollbooth is didip/tollbooth v7.0.2 (v8 is not on the module proxy
// here): LimitHandler over NewLimiter(rate per second), a token bucket per
// key (a copy of x/time/rate), with SetBurst(bucket) and SetIgnoreURL(true).
// Its default key is the client's IP and the request's path: with one page
// a path, that would give every page a bucket of its own and limit
// nothing, so the URL is left out, as a service limiting its clients does.
// Every answer carries X-Rate-Limit-Limit (the rate, "10.00"),
// X-Rate-Limit-Duration: 1, X-Rate-Limit-Request-Remote-Addr, and the IETF
// draft's RateLimit-Limit (the rate per second, rounded), RateLimit-Reset:
// 1 (always) and RateLimit-Remaining (the whole tokens left, 0 on a 429).
// A 429 says "You have reached maximum request limit." with no
// Retry-After.
func newTollbooth(q limQuota, next http.Handler) http.Handler {
	lmt := tollbooth.NewLimiter(q.rate(), nil).SetBurst(q.bucket()).SetIgnoreURL(true)
	return tollbooth.LimitHandler(lmt, next)
}

// newUlule is ulule/limiter v3.11.2: its stdlib middleware over its memory
// store, Rate{Limit: limit, Period: window}, keyed by the client's IP (the
// default KeyGetter). A fixed window that starts with the first request
// of a key and ends a period later (not aligned to the clock); refused
// requests count too. Every answer carries X-RateLimit-Limit,
// -Remaining and -Reset (the window's end as a Unix time, truncated to the
// second); a 429 says "Limit exceeded" with no Retry-After. The store is
// made with CleanUpInterval 0, which starts no cleaner: its default (30 s)
// starts a goroutine on a ticker that only a finalizer stops, which would
// keep a synctest bubble alive for ever. The counters still expire when
// read, which is all the limiter needs.
func newUlule(q limQuota, next http.Handler) http.Handler {
	store := ululememory.NewStoreWithOptions(ulule.StoreOptions{Prefix: ulule.DefaultPrefix, CleanUpInterval: 0})
	lmt := ulule.New(store, ulule.Rate{Formatted: q.name, Period: q.window, Limit: int64(q.limit)})
	return ululestdlib.NewMiddleware(lmt).Handler(next)
}
