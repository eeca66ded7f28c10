package retryhttp

import (
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"golang.org/x/time/rate"
)

// Defaults. Each has a reason in the README's defaults table.
const (
	// DefaultMaxAttempts is the number of tries a request gets, the first included.
	DefaultMaxAttempts = 3
	// DefaultBackoffBase is the first backoff window: the first retry waits
	// uniform(0, 500ms) when the server names no wait.
	DefaultBackoffBase = 500 * time.Millisecond
	// DefaultBackoffMax caps the backoff window.
	DefaultBackoffMax = 30 * time.Second
	// DefaultRetryAfterFloor is the least a server-named wait is taken to be,
	// so that "Retry-After: 0" cannot turn a retry loop into a flood.
	DefaultRetryAfterFloor = time.Second
	// DefaultRetryAfterMax is the longest server-named wait the Transport
	// sleeps through; a longer one makes it give up at once and park the host.
	DefaultRetryAfterMax = 60 * time.Second
	// DefaultReplayLimit is the largest request body without GetBody that
	// the Transport keeps a copy of, as the base reads it, to send again on
	// a retry; see WithReplayLimit.
	DefaultReplayLimit = 256 << 10
	// MaxParking bounds how long one answer can park a host, however far
	// away the moment it names: a mistaken "Retry-After: 86400" takes a host
	// off line for an hour at most.
	MaxParking = time.Hour
)

// defaultStatuses are the statuses retried unless WithRetryStatuses says
// otherwise. Cloudflare's 520 to 523 are its 502 (the origin's answer was
// empty or malformed, or no connection to the origin could be made); its 524
// is not among them: the origin took the request and did not answer within
// 100 s, so another try costs 100 s more of an origin that is busy with the
// first.
var defaultStatuses = []int{
	http.StatusRequestTimeout,      // 408
	http.StatusTooManyRequests,     // 429
	http.StatusInternalServerError, // 500
	http.StatusBadGateway,          // 502
	http.StatusServiceUnavailable,  // 503
	http.StatusGatewayTimeout,      // 504
	520,                            // Cloudflare: the origin's answer was empty or unknown
	521,                            // Cloudflare: the origin refused the connection
	522,                            // Cloudflare: the connection to the origin timed out
	523,                            // Cloudflare: the origin is unreachable
	529,                            // Anthropic, and others: overloaded
}

// config is what the options set. newConfig fills in every default, in
// one place, so that the Transport reads settled values only.
//
// nil means the default for what a Transport cannot do without (the base,
// the limiter, the clock, the jitter source) and "none" for what is
// optional (the budget, the hooks, the logger, the predicate).
type config struct {
	base                    http.RoundTripper
	maxAttempts             int
	backoffBase, backoffMax time.Duration
	raFloor, raMax          time.Duration
	statusCodes             *[]int
	statuses                statusSet
	retryIf                 func(*http.Response, error) bool
	pace                    Pace
	hostPace                map[string]Pace
	limiter                 Limiter
	budget                  *Budget
	budgetSet               bool
	noLearning              bool
	autoKey                 bool
	safeToRepeat            []func(*http.Request) bool
	attemptTimeout          time.Duration
	hedging                 bool
	hedgeDelay              time.Duration // 0: learned
	replayLimit             int64
	onRetry, onGiveUp       []func(RetryEvent)
	onPark                  []func(ParkEvent)
	logger                  *slog.Logger
	rand                    func() float64
	clock                   Clock
}

// newConfig applies opts in order, then fills in the defaults.
func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.base == nil {
		c.base = cleanhttp.DefaultPooledTransport()
	}
	if c.maxAttempts < 1 {
		c.maxAttempts = DefaultMaxAttempts
	}
	if c.backoffBase <= 0 {
		c.backoffBase = DefaultBackoffBase
	}
	if c.backoffMax <= 0 {
		c.backoffMax = DefaultBackoffMax
	}
	c.backoffMax = max(c.backoffMax, c.backoffBase)
	if c.raFloor <= 0 {
		c.raFloor = DefaultRetryAfterFloor
	}
	if c.raMax <= 0 {
		c.raMax = DefaultRetryAfterMax
	}
	c.raMax = max(c.raMax, c.raFloor)
	if c.statusCodes != nil {
		c.statuses = newStatusSet(*c.statusCodes)
	} else {
		c.statuses = defaultStatusSet
	}
	if c.pace == (Pace{}) {
		c.pace = Pace{Limit: rate.Inf}
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	switch c.limiter.(type) {
	case nil:
		c.limiter = newLocalLimiter(c.clock)
	case *localLimiter, *sharedLimiter:
	default:
		c.limiter = &sharedLimiter{local: newLocalLimiter(c.clock), shared: c.limiter}
	}
	if !c.budgetSet {
		c.budget = NewBudget(0.1, 1)
	}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	if c.replayLimit == 0 {
		c.replayLimit = DefaultReplayLimit
	}
	return c
}

// Option configures a Transport. Options are applied in order by New; the
// Transport cannot be changed afterwards.
type Option func(*config)

// WithBase sets the RoundTripper that makes each attempt. nil means the
// default, a pooled transport from cleanhttp.DefaultPooledTransport (no
// shared global state, keep-alives on, sane timeouts).
func WithBase(rt http.RoundTripper) Option {
	return func(c *config) { c.base = rt }
}

// WithMaxAttempts sets how many tries a request gets in all, the first
// included: 1 means no retries. n < 1 means the default, 3.
func WithMaxAttempts(n int) Option {
	return func(c *config) { c.maxAttempts = n }
}

// WithBackoff sets the full-jitter backoff used when the server names no
// wait: the nth retry waits uniform(0, min(max, base*2^(n-1))). A base or max
// of zero or less means the default (500 ms, 30 s); a max below base is
// raised to base.
func WithBackoff(base, max time.Duration) Option {
	return func(c *config) { c.backoffBase, c.backoffMax = base, max }
}

// WithRetryAfterLimits bounds a wait named by a server (Retry-After or a
// rate-limit reset). A shorter wait is lengthened to floor; a longer one than
// max is not slept through: the Transport returns that response at once and
// parks the host. Zero or less means the default (floor 1 s, max 60 s); a max
// below floor is raised to floor.
func WithRetryAfterLimits(floor, max time.Duration) Option {
	return func(c *config) { c.raFloor, c.raMax = floor, max }
}

// WithRetryStatuses replaces the set of response statuses that are retried
// (default 408, 429, 500, 502, 503, 504, 520, 521, 522, 523 and 529). With no
// codes, no status is retried; codes outside 100 to 599 are ignored. Two
// answers are judged beside the set: a 403 that refuses for a quota is
// retried when 429 is in it, and a failure whose server says X-Should-Retry
// is retried, or not, as it says (DefaultRetryIf).
func WithRetryStatuses(codes ...int) Option {
	return func(c *config) {
		s := append([]int(nil), codes...)
		c.statusCodes = &s
	}
}

// WithExtraRetryStatuses adds codes to the set of response statuses that
// are retried: to the defaults, or to the set of a WithRetryStatuses given
// before it, so that one more status (a 409 of an API that answers it to a
// conflict that passes) needs no restating of the others. Codes outside 100
// to 599 are ignored; with no codes it changes nothing.
func WithExtraRetryStatuses(codes ...int) Option {
	return func(c *config) {
		var s []int
		if c.statusCodes != nil {
			s = *c.statusCodes
		} else {
			s = defaultStatuses
		}
		s = append(append([]int(nil), s...), codes...)
		c.statusCodes = &s
	}
}

// WithRetryIf replaces the classification: f says whether a response, or
// the error of a try that got none, is worth another try. Exactly one of
// its arguments is non-nil. Without it the Transport uses the statuses of
// WithRetryStatuses and the transient errors of DefaultRetryIf; compose
// DefaultRetryIf to extend the default. f decides what is worth retrying,
// not what is safe: a request that is not idempotent, a body that cannot be
// rewound, a server wait beyond the max, a cancelled context, the budget and
// the attempts still refuse a retry f asked for. f runs on the request's
// goroutine, must be safe for concurrent use, and may read a bounded prefix
// of the body with PeekBody. nil means the default.
func WithRetryIf(f func(*http.Response, error) bool) Option {
	return func(c *config) { c.retryIf = f }
}

// WithPace sets the pace for every host without a WithHostPace of its own:
// at most r attempts a second on average and burst at once. Every attempt
// spends a token, retries included. The default is no pace (rate.Inf). A
// burst below 1 is taken as 1; an r that is zero, negative or NaN means no
// pace, since a pace that never admits anything would hang every request.
func WithPace(r rate.Limit, burst int) Option {
	return func(c *config) { c.pace = newPace(r, burst) }
}

// WithHostPace sets the pace for one host, overriding WithPace. The host is
// matched without case and without its scheme's default port, so
// "API.example.com:443" and "api.example.com" are the same host for https.
// Arguments are checked as in WithPace.
func WithHostPace(host string, r rate.Limit, burst int) Option {
	return func(c *config) {
		if c.hostPace == nil {
			c.hostPace = make(map[string]Pace)
		}
		c.hostPace[normalizeHostOption(host)] = newPace(r, burst)
	}
}

// WithLimiter shares pacing and parking through l, for example a
// redislimit.Limiter that shares them across processes through Redis. The
// pace settings stay in WithPace and WithHostPace; l enforces them, holds
// the parkings, and may learn a host's pace for all. The host model (each
// host's state: a down host handed back at once, a limit in flight, a
// learned pace) still runs in the process beside it, and a request goes
// when both let it. nil means the in-process limiter alone.
func WithLimiter(l Limiter) Option {
	return func(c *config) { c.limiter = l }
}

// WithBudget sets the retry budget, which can be shared by several
// Transports. The default is a budget of the Transport's own,
// NewBudget(0.1, 1); nil turns the budget off.
func WithBudget(b *Budget) Option {
	return func(c *config) { c.budget, c.budgetSet = b, true }
}

// WithAutoIdempotencyKey makes the Transport add an Idempotency-Key header,
// a random UUID v4 from crypto/rand, to every POST and PATCH that carries
// neither Idempotency-Key nor X-Idempotency-Key. The key is made once, before
// the first try, and every retry sends the same one; the caller's request is
// not touched. Such requests may then be retried like PUTs. Off by default:
// the server must honour the key for this to be safe.
func WithAutoIdempotencyKey() Option {
	return func(c *config) { c.autoKey = true }
}

// WithSafeToRepeat says which requests are safe to repeat although their
// method is not: those for which f returns true, such as the POSTs of an
// LLM completion or a search. Such a request is retried after a failure that
// may have reached the server (a 500, a 503, a reset connection) as a PUT
// would be. Off by default: a POST without an idempotency key is sent again
// only when the server certainly did not act on it. f is asked after a
// failure, and, under WithHedging, before the first attempt of a request
// whose method and key do not make it safe (a hedge repeats a request that
// has not failed), on the request's goroutine; it must not modify the
// request.
// Each WithSafeToRepeat adds a predicate; a request is safe when one says
// so; nil adds none. PolicySafeToRepeat says the same of one request, or one
// task, through its context.
func WithSafeToRepeat(f func(*http.Request) bool) Option {
	return func(c *config) {
		if f != nil {
			c.safeToRepeat = append(c.safeToRepeat, f)
		}
	}
}

// WithAttemptTimeout bounds each attempt, from the moment it is sent until
// its response headers arrive, at d: an attempt that takes longer is
// abandoned (its context cancelled, so the base lets go of it) and counts
// as failed, with an error that errors.Is(err, context.DeadlineExceeded)
// and says which attempt timed out (*AttemptTimeoutError). It is tried
// again when the request is safe to repeat (a GET, a PUT, a keyed POST;
// an unkeyed POST is not, since it may have reached the server), at once:
// the time it waited is its backoff; the pace, the parking and the budget
// still apply. The body is the caller's and is never cut by it. The
// request's own deadline bounds everything. 0, the default, means no
// attempt timeout; ContextWithPolicy(ctx, PolicyAttemptTimeout(d)) sets
// one for a request.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *config) { c.attemptTimeout = max(d, 0) }
}

// WithHedging sends one more attempt of a request that is safe to repeat
// (its method or key, or WithSafeToRepeat, and a body that GetBody can give
// again, or none) when its first attempt has not answered after delay, and
// one more again when that hedge too is unanswered delay after it was
// sent: at most 3 attempts in all, the first included (fewer under a
// WithMaxAttempts below 3), all of them in flight at once at worst. The
// first answer that needs no retry wins, and the other attempts are
// cancelled and their bodies closed. A hedge is an attempt only once it
// is sent: until then it holds no budget, no body (GetBody is called just
// before it goes), no event and no pace slot, and a first answer that comes
// meanwhile abandons it; a first answer that ends the call or parks the
// host comes back at once. Once sent it went through the host's pace and
// parking, spent the retry budget (refunded when it wins, so an outage is
// never doubled), carries its resend count, and was reported to the
// OnRetry hooks with RetryEvent.Hedge set, and logged, just before it
// went (on the hedge's goroutine). A hedge due and not sent (budget,
// parking, pace, GetBody, or every attempt still unanswered and no more
// allowed: ReasonAttempts) is reported to the OnGiveUp hooks with
// RetryEvent.Hedge and its Reason, and logged. A request whose policy
// turns retries off is not hedged. delay 0 means learned: from the
// latencies of the host's recent answers, their 95th percentile and an
// eighth, never below 50 ms; 250 ms while none are known; the latencies
// are kept by the Transport for this alone (whatever WithLearning says),
// for at most 256 hosts at once. Off by default.
// The delay runs on the runtime's timers (virtual inside a
// testing/synctest bubble), not on WithClock's clock.
func WithHedging(delay time.Duration) Option {
	return func(c *config) {
		c.hedging, c.hedgeDelay = true, max(delay, 0)
	}
}

// WithOnRetry adds a hook called once for every retry, just before it is
// sent: RetryEvent.Delay is how long it waited since the failure (backoff,
// server-named wait, pace and parking), and Reason is empty. Counting its
// calls counts the retries. Each WithOnRetry adds a hook, called in the
// order given, so that logging and metrics can each have one. A hook runs
// on the goroutine of the request and must not block; nil adds none.
func WithOnRetry(f func(RetryEvent)) Option {
	return func(c *config) {
		if f != nil {
			c.onRetry = append(c.onRetry, f)
		}
	}
}

// WithOnGiveUp adds a hook called when a failed try that the
// classification says is worth retrying is handed back instead, with
// RetryEvent.Reason saying why (ReasonAttempts, ReasonBudget, ...). It is
// not called for answers that are not retried at all (a 404, a 200). Hooks
// add up and run as WithOnRetry's do; nil adds none.
func WithOnGiveUp(f func(RetryEvent)) Option {
	return func(c *config) {
		if f != nil {
			c.onGiveUp = append(c.onGiveUp, f)
		}
	}
}

// WithOnPark adds a hook called when an answer parks its host: a
// Retry-After, or a spent quota with its reset, names a wait, and every
// request to the host through the Transport waits until ParkEvent.Until or
// fails fast with ErrHostPaused. Hooks add up and run as WithOnRetry's do;
// nil adds none.
func WithOnPark(f func(ParkEvent)) Option {
	return func(c *config) {
		if f != nil {
			c.onPark = append(c.onPark, f)
		}
	}
}

// WithReplayLimit sets the largest request body without GetBody that can be
// retried: the Transport keeps a copy of what the base reads of such a body,
// up to n bytes, and sends the copy on a retry once the base has closed the
// body. A body that says it is longer (ContentLength), or turns out to be,
// is sent once, and the Reason of its refused retry is ReasonNoRewind. A
// body that is an io.Seeker is rewound by seeking instead, whatever its
// size. Bodies with GetBody, the usual case, are never copied. 0 means the
// default, DefaultReplayLimit (256 KiB); n < 0 turns copying off.
func WithReplayLimit(n int64) Option {
	return func(c *config) { c.replayLimit = n }
}

// WithLearning turns per-host learning on or off. On, the default, the
// Transport paces a host that announces its quota (X-RateLimit-Limit,
// RateLimit-Policy) at the announced rate, and a host that refuses (429, or
// 503 naming no wait) below the rate it accepted, growing back while it
// answers well; a host that never refuses and announces nothing is never
// paced. WithPace and WithHostPace stay upper bounds either way. Off, only
// the configured paces and the parkings apply.
func WithLearning(on bool) Option {
	return func(c *config) { c.noLearning = !on }
}

// WithLogger sets the logger that gets one line per retry, as its wait
// starts ("retryhttp: retrying"), and per refused retry ("retryhttp: not
// retrying", with the reason): method, host, path (never the query), the
// attempt as "2 of 3", the last try's status or error, and the wait in
// seconds, to the millisecond (a number in a JSON handler). A host's change
// of state (down, back, a learned pace or limit, a quota) gets a line of
// its own. Headers and bodies are never logged. nil, the default, logs
// nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithRand sets the source of the backoff jitter: f returns a number in
// [0, 1) and must be safe for concurrent use when the Transport is. Values
// outside [0, 1) are clamped into it. nil means math/rand/v2.Float64.
func WithRand(f func() float64) Option {
	return func(c *config) { c.rand = f }
}

// WithClock sets the Clock for timestamps and waits. nil means the real
// clock. Tests should prefer testing/synctest, which makes the real clock
// virtual; this is for simulations such as examples/lab.
func WithClock(clk Clock) Option {
	return func(c *config) { c.clock = clk }
}

// maxPaceInterval bounds the time between two tokens so that interval ×
// burst cannot overflow a Duration.
const (
	maxPaceInterval = time.Hour
	maxPaceBurst    = 1_000_000
)

// newPace checks a pace; see WithPace for what each bad value becomes.
func newPace(r rate.Limit, burst int) Pace {
	if math.IsNaN(float64(r)) || r <= 0 || r == rate.Inf {
		return Pace{Limit: rate.Inf}
	}
	if float64(r) < 1/maxPaceInterval.Seconds() {
		r = rate.Limit(1 / maxPaceInterval.Seconds())
	}
	burst = min(max(burst, 1), maxPaceBurst)
	return Pace{Limit: r, Burst: burst}
}
