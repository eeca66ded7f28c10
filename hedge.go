package retryhttp

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// Hedging (WithHedging): when the first attempt of a request that is safe
// to repeat has not answered after a delay, one more is sent beside it, and
// the first answer that needs no retry wins; the other attempt is cancelled
// and its body closed. A hedge is an attempt like any: it waits for its
// host's pace and parking, spends the retry budget (refunded when it wins),
// carries its resend count, and is reported to the hooks (RetryEvent.Hedge)
// and the log. The delay is fixed, or learned from the host's recent answers
// (The Tail at Scale, Dean and Barroso 2013: a hedge after the 95th
// percentile cuts the tail for a few percent more requests).

// hedgeFloor is the shortest learned hedge delay: a hedge sooner than this
// saves less than it costs (a request, maybe a connection).
const hedgeFloor = 10 * time.Millisecond

// learnedHedge is the delay a host's latencies call for: their 95th
// percentile and an eighth, so that a host whose answers all take the same
// time is not hedged for the jitter of its clock; 0 when none are known.
func learnedHedge(p95 time.Duration) time.Duration {
	if p95 <= 0 {
		return 0
	}
	return max(hedgeFloor, p95+p95/8)
}

// hedgeAfter returns when to hedge the call's first attempt; 0 for never.
func (c *call) hedgeAfter() time.Duration {
	t := c.t
	if !t.hedging || c.maxAttempts < 2 || !rewindable(c.req) ||
		!(c.key != "" || replayable(c.req) || c.safeToRepeat()) {
		return 0
	}
	if t.hedgeDelay > 0 {
		return t.hedgeDelay
	}
	return learnedHedge(c.adm.latency)
}

// hedgeTry is one of the attempts of a hedged request.
type hedgeTry struct {
	n      int
	adm    admission
	cancel context.CancelFunc
	hedge  bool

	mu       sync.Mutex
	resp     *http.Response
	err      error
	admitErr error // the hedge was not admitted: no attempt
	lost     bool  // another answered first: clean up after yourself
}

// hedged makes the first attempt, and a hedge after delay if the first has
// not answered by then. It returns the winning answer, observed, its n the
// attempts made (2 when the hedge went), and whether it was a plain
// success.
func (c *call) hedged(req *http.Request, delay time.Duration) (answer, bool) {
	c.hostName() // made once, before attempts run side by side
	done := make(chan *hedgeTry, 2)
	tries := []*hedgeTry{c.launch(req, &hedgeTry{n: 1, adm: c.adm}, done)}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	fired := timer.C
	var last answer
	for pending := 1; pending > 0; {
		select {
		case tr := <-done:
			pending--
			if tr.admitErr != nil {
				c.uncharge() // the hedge never went
				continue
			}
			a := answer{n: len(tries), resp: tr.resp, err: tr.err, adm: tr.adm}
			plain := !c.observe(&a)
			if plain || pending == 0 || !c.retryable(&a) {
				c.abandon(tries, tr, done)
				if tr.hedge && plain {
					c.paidFor() // the hedge won: it paid for itself
				}
				if !tr.hedge {
					c.keepCharge() // the hedge lost: it was an extra request
				}
				return a, plain
			}
			// Failed while the other may yet answer: wait for it.
			if a.resp != nil {
				drain(a.resp)
			}
			tr.cancel()
			last = a
		case <-fired:
			fired = nil
			if h := c.hedge(req, delay, done); h != nil {
				tries = append(tries, h)
				pending++
			}
		}
	}
	return last, false
}

// hedge sends the hedge, if the budget has a retry for it; it is admitted
// through the host's pace and parking on its own goroutine.
func (c *call) hedge(req *http.Request, delay time.Duration, done chan *hedgeTry) *hedgeTry {
	t := c.t
	now := t.clock.Now()
	if t.budget != nil {
		if !t.budget.tryRetry(now) {
			return nil
		}
		c.charge(now)
	}
	next, reason := c.rewind(1)
	if reason != "" {
		c.uncharge()
		return nil
	}
	tr := &hedgeTry{n: 2, hedge: true}
	c.reportHedge(delay)
	return c.launch(next, tr, done)
}

// launch runs tr's attempt on a goroutine of its own, which ends with it.
// A hedge is admitted there first. The goroutine takes copies of what it
// needs of the call, which stays on its own goroutine's stack.
func (c *call) launch(req *http.Request, tr *hedgeTry, done chan *hedgeTry) *hedgeTry {
	ctx, cancel := context.WithCancel(req.Context())
	tr.cancel = cancel
	t, host, timeout, callerCtx := c.t, c.hostName(), c.attemptTimeout, c.ctx
	go func() {
		if tr.hedge {
			adm, err := t.admit(ctx, host, t.clock.Now())
			if err != nil {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				tr.admitErr = err
				if !tr.lost {
					done <- tr
				}
				return
			}
			tr.adm = adm
		}
		if t.budget == nil && !t.noLearning {
			t.sent.add(tr.adm.at)
		}
		resp, err := t.attempt(req.WithContext(ctx), tr.n, timeout)
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.lost {
			t.cleanUp(callerCtx, host, tr.adm, resp)
			cancel()
			return
		}
		tr.resp, tr.err = resp, err
		done <- tr // buffered for both attempts: never blocks
	}()
	return tr
}

// abandon cancels every attempt but the winner's, and cleans up after those
// that answered already; the winner's context lives until its body closes.
func (c *call) abandon(tries []*hedgeTry, winner *hedgeTry, done chan *hedgeTry) {
	for _, tr := range tries {
		if tr == winner {
			continue
		}
		tr.mu.Lock()
		tr.lost = true
		tr.cancel()
		tr.mu.Unlock()
	}
	for {
		select {
		case tr := <-done:
			if tr.admitErr == nil {
				c.t.cleanUp(c.ctx, c.hostName(), tr.adm, tr.resp)
			}
		default:
			if winner.resp != nil {
				winner.resp.Body = bodyWithCancel(winner.resp.Body, winner.cancel)
			} else {
				winner.cancel()
			}
			return
		}
	}
}

// cleanUp closes a lost attempt's answer and gives its ticket back: it
// says nothing of the host, which was not let finish.
func (t *Transport) cleanUp(ctx context.Context, host string, adm admission, resp *http.Response) {
	if resp != nil {
		resp.Body.Close()
	}
	t.giveBack(context.WithoutCancel(ctx), host, adm)
}
