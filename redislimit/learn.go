package redislimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/retryhttp/retryhttp"
	"golang.org/x/time/rate"
)

// What a host says of its capacity is learned in Redis, by the rules of
// the core's learn.go, so that every process paces by what any of them
// learned; while Redis is away a cruder learner in process stands in.

// Learn records what an answer from host says of its capacity, in Redis,
// and returns the host's status: overloaded, with the pace every process
// shares, once a refusal or a quota taught one; healthy otherwise.
func (l *Limiter) Learn(ctx context.Context, host string, sig retryhttp.Signal) (retryhttp.HostStatus, error) {
	p, err := l.learnPace(ctx, host, sig)
	st := retryhttp.HostStatus{Pace: p}
	if !p.Unlimited() {
		st.State = retryhttp.HostOverloaded
	}
	return st, err
}

// learnPace is Learn's pace.
func (l *Limiter) learnPace(ctx context.Context, host string, sig retryhttp.Signal) (retryhttp.Pace, error) {
	if l.closed.Load() {
		return retryhttp.Pace{}, ErrClosed
	}
	if sig.Failed || sig.Refused || sig.Down != nil || sig.Limit > 0 {
		// What Redis said of the host may change with this: its next
		// request asks (see freeReserve).
		l.free.forget(host)
	}
	srv := l.serverFor(host)
	if !l.useRedis(srv) {
		return l.mem.learn(host, sig), nil
	}
	mode, refused := "q", "0"
	if sig.Limit > 0 || sig.Refused {
		mode = "l"
	}
	if sig.Refused {
		refused = "1"
	}
	reset := int64(-1)
	if sig.Reset >= 0 {
		reset = us(sig.Reset)
	}
	sent := "0"
	if sig.Refused && l.mem.firstRefusal(host, sig.Now) {
		sent = strconv.FormatFloat(max(sig.Sent, 0), 'f', 3, 64)
	}
	// What a host said of its capacity matters to every process: it is
	// recorded even if the request that heard it is cancelled.
	down := ""
	switch {
	case sig.Down != nil:
		down = "d"
	case !sig.Failed && !sig.Refused && sig.Status > 0 && !noOrigin(sig.Status):
		down = "u" // an answer got through: a host marked down is not
	}
	res, err := l.run(context.WithoutCancel(ctx), srv, learnScript, []string{l.prefix + host}, mode, refused, sig.Status,
		us(max(sig.Wait, 0)), max(sig.Limit, 0), us(max(sig.Window, 0)), reset, sig.Remaining, sent, down)
	if err == nil && len(res) < 2 {
		err = fmt.Errorf("redislimit: unexpected answer from the learn script: %v", res)
	}
	if err != nil {
		if permanent(err) {
			return retryhttp.Pace{}, &RefusedError{Op: "learn", Key: l.prefix + host, Err: err}
		}
		l.fail(srv, err)
		return l.mem.learn(host, sig), nil
	}
	l.answered(srv)
	r, b := float64(res[0])/1e6, int(res[1])
	l.mem.learned(host, sig.Now, r, b)
	if r <= 0 {
		return retryhttp.Pace{Limit: rate.Inf}, nil
	}
	return retryhttp.Pace{Limit: rate.Limit(r), Burst: max(b, 1)}, nil
}

// learned records the learned pace Redis returned for host (rate 0: none).
func (m *memory) learned(host string, now time.Time, rate float64, burst int) {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil {
		if rate <= 0 {
			return
		}
		h = s.get(host, now)
	}
	h.lrate, h.lburst = rate, burst
	if rate <= 0 {
		h.told = false
	}
}

// firstRefusal reports whether a refusal from host is this process's first
// since the host was last unpaced, and records it.
func (m *memory) firstRefusal(host string, now time.Time) bool {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil {
		h = s.get(host, now)
	}
	first := !h.told
	h.told = true
	return first
}

// learn is Limiter.Learn in process, while Redis is away: an announced
// quota sets the pace, and a refusal cuts it, once a second, to 0.9 of
// the pace or, for a host not paced yet, of what the process sent in the
// last second. It does not grow: that waits for Redis. It returns the
// learned pace, unlimited when none.
func (m *memory) learn(host string, sig retryhttp.Signal) retryhttp.Pace {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if sig.Limit <= 0 && !sig.Refused {
		if h == nil || h.lrate <= 0 {
			return retryhttp.Pace{Limit: rate.Inf}
		}
		return retryhttp.Pace{Limit: rate.Limit(h.lrate), Burst: max(h.lburst, 1)}
	}
	if h == nil {
		h = s.get(host, sig.Now)
	}
	if sig.Limit > 0 && sig.Window > 0 && sig.Window <= learnMaxWindow {
		if r := float64(sig.Limit) / sig.Window.Seconds(); r <= learnMaxRate {
			h.lrate, h.lburst = max(r, learnMinRate), 1
		}
	}
	if sig.Refused && !sig.Now.Before(h.lhold) {
		base := sig.Sent
		if h.lrate > 0 {
			base = h.lrate
		}
		h.lrate, h.lburst, h.lhold = max(learnBeta*base, learnMinRate), 1, sig.Now.Add(learnHold)
	}
	if h.lrate <= 0 {
		return retryhttp.Pace{Limit: rate.Inf}
	}
	return retryhttp.Pace{Limit: rate.Limit(h.lrate), Burst: max(h.lburst, 1)}
}

// noOrigin reports a status by which a gateway says the origin gave no
// answer (502, 504, Cloudflare's 520 to 523): such an answer does not clear
// a host marked down. The core's rule, repeated: it is not exported.
func noOrigin(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusGatewayTimeout || (status >= 520 && status <= 523)
}
