package redislimit_test

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
)

// Processes that share a Redis and a prefix keep together to each host's
// pace, and all stop for a host that one of them was told to leave alone.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // the Limiter can then call it directly
	})
	limiter := redislimit.New(rdb,
		redislimit.WithPrefix("myapp:retryhttp:"),
		redislimit.WithLogger(slog.Default()),
	)
	defer limiter.Close() // stops the goroutines it started; rdb stays open
	client := retryhttp.NewClient(
		retryhttp.WithLimiter(limiter),
		retryhttp.WithPace(10, 1),                      // 10 a second per host, all processes together
		retryhttp.WithHostPace("api.github.com", 1, 5), // a host with a pace of its own
	)
	_ = client // use it as any *http.Client
}
