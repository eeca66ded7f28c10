package retryhttp

import (
	"context"
	"net/http"
	"time"
)

// A Transport's options apply to every request it sends; a policy on a
// request's context changes what one request, or one part of a program,
// gets: more tries for a request that must get through, none for a health
// check, a predicate of its own for an endpoint that fails its own way.
// What makes a retry safe is not a policy: idempotency, rewinding, the
// Retry-After bounds, the budget and the context apply to every request.

// PolicyOption changes the retry policy of the requests made with a
// context; see ContextWithPolicy.
type PolicyOption func(*policy)

// policy is what the PolicyOptions of a context set; zero fields mean the
// Transport's own setting.
type policy struct {
	maxAttempts    int
	retryIf        func(*http.Response, error) bool
	safeToRepeat   bool
	attemptTimeout time.Duration
}

type policyKey struct{}

// ContextWithPolicy returns a copy of ctx whose requests get the retry
// policy of opts instead of the Transport's own, for what opts change. A
// policy already on ctx is kept for what opts do not change, so a program
// can set a policy for a whole task and refine it for one request.
//
//	ctx := retryhttp.ContextWithPolicy(req.Context(), retryhttp.PolicyMaxAttempts(5))
//	resp, err := client.Do(req.WithContext(ctx))
//
// The policy applies to every request made with the context through a
// Transport of this package (only the outermost one retries, when
// Transports are nested).
// Pacing and parking apply whatever the policy: they are the host's due,
// not the request's.
func ContextWithPolicy(ctx context.Context, opts ...PolicyOption) context.Context {
	var p policy
	if prev, ok := ctx.Value(policyKey{}).(*policy); ok {
		p = *prev
	}
	for _, o := range opts {
		if o != nil {
			o(&p)
		}
	}
	return context.WithValue(ctx, policyKey{}, &p)
}

// PolicyMaxAttempts sets how many tries the request gets in all, the first
// included, as WithMaxAttempts does for a Transport: 1 means no retries.
// n < 1 means the Transport's own setting.
func PolicyMaxAttempts(n int) PolicyOption {
	return func(p *policy) { p.maxAttempts = max(n, 0) }
}

// PolicyNoRetry turns retries off: the request gets one try, paced and
// parked like any. It is PolicyMaxAttempts(1).
func PolicyNoRetry() PolicyOption { return PolicyMaxAttempts(1) }

// PolicyRetryIf replaces the classification for the request, as WithRetryIf
// does for a Transport, with the same safety rules. nil means the
// Transport's own classification.
func PolicyRetryIf(f func(*http.Response, error) bool) PolicyOption {
	return func(p *policy) { p.retryIf = f }
}

// PolicySafeToRepeat says that the requests made with the context are safe
// to repeat although their method is not: a POST that searches, an LLM
// completion, a call whose second execution does no harm the caller cares
// about. Such a request is retried after a failure that may have reached the
// server (a 500, a 503, a reset connection) as a PUT would be; without it,
// the default, a POST without an idempotency key is sent again only when the
// server certainly did not act on it. Say it only of calls that are: a
// repeated completion is billed twice if the server did the first. The
// other rules stay: the classification, the attempts, the body, the bounds
// on waits and the budget.
func PolicySafeToRepeat() PolicyOption {
	return func(p *policy) { p.safeToRepeat = true }
}

// applyPolicy settles the call's attempts and predicate: the Transport's,
// changed by a policy on the request's context.
func (c *call) applyPolicy() {
	t := c.t
	c.maxAttempts, c.retryIf, c.attemptTimeout = t.maxAttempts, t.retryIf, t.attemptTimeout
	p, ok := c.ctx.Value(policyKey{}).(*policy)
	if !ok {
		return
	}
	if p.maxAttempts > 0 {
		c.maxAttempts = p.maxAttempts
	}
	if p.retryIf != nil {
		c.retryIf = p.retryIf
	}
	if p.attemptTimeout != 0 {
		c.attemptTimeout = max(p.attemptTimeout, 0)
	}
}

// PolicyAttemptTimeout bounds each attempt of the requests made with the
// context, from its send until its response headers, as WithAttemptTimeout
// does for a Transport. d < 0 turns the Transport's attempt timeout off for
// them; 0 means the Transport's own.
func PolicyAttemptTimeout(d time.Duration) PolicyOption {
	return func(p *policy) {
		if d < 0 {
			d = -1
		}
		p.attemptTimeout = d
	}
}
