package redislimit

import (
	"context"
	"strconv"
	"time"
)

// The keeper is one goroutine per Limiter, running while the process holds
// a claim or a parking. It gives back the claims of hosts the process no
// longer calls, so that the others take their share again at once rather
// than leaving it for a process that may be cut off; and, while it holds
// parkings, it asks each server it made no other call to lately for its
// epoch, so that parkings lost with a server's data (a restart go-redis's
// retries hid, a flush) are put back within a fraction of a second.
const (
	keepTick   = 100 * time.Millisecond
	epochEvery = 250 * time.Millisecond
	// leaveBudget bounds the goodbyes Close says, all together.
	leaveBudget = time.Second
)

// keepOn starts the keeper unless it runs.
func (l *Limiter) keepOn() {
	if l.rdb == nil || !l.keeping.CompareAndSwap(false, true) {
		return
	}
	if !l.spawn(l.keep) {
		l.keeping.Store(false)
	}
}

func (l *Limiter) keep() {
	t := time.NewTicker(keepTick)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			l.keeping.Store(false)
			return
		case <-t.C:
		}
		now := time.Now()
		for _, g := range l.mem.idle(now, l.isDown) {
			l.leave(l.ctx, g)
		}
		parked := l.mem.parkings(now) != nil
		if parked {
			l.checkEpochs()
		}
		if parked || l.mem.claims() > 0 {
			continue
		}
		// Nothing to keep: stop, unless a claim or a parking came
		// meanwhile and found the keeper still running.
		l.keeping.Store(false)
		if (l.mem.parkings(time.Now()) == nil && l.mem.claims() == 0) || !l.keeping.CompareAndSwap(false, true) {
			return
		}
	}
}

// isDown reports whether host's server is failing just now.
func (l *Limiter) isDown(host string) bool { return l.serverFor(host).down.Load() }

// goodbye is a claim to give back: the host and the deadline its
// process last set.
type goodbye struct {
	host     string
	deadline int64
}

// leave gives back the claim g: the other processes take its share at
// once. A failure leaves the claim to end by itself.
func (l *Limiter) leave(ctx context.Context, g goodbye) {
	srv := l.serverFor(g.host)
	res, err := l.run(ctx, srv, leaveScript, []string{l.prefix + g.host}, l.id, strconv.FormatInt(g.deadline, 10))
	if err != nil || len(res) < 1 {
		if err != nil && !permanent(err) && ctx.Err() == nil {
			l.fail(srv, err)
		}
		return
	}
	l.answered(srv)
	held := int64(-1)
	if res[0] == 0 && len(res) > 1 {
		held = res[1]
	}
	l.mem.left(g.host, g.deadline, held)
}

// leaveAll gives back every claim the process holds, for Close, within
// leaveBudget.
func (l *Limiter) leaveAll() {
	if l.rdb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaveBudget)
	defer cancel()
	for _, g := range l.mem.held(l.isDown) {
		if ctx.Err() != nil {
			return
		}
		l.leave(ctx, g)
	}
}

// checkEpochs asks each server with an epoch marker that no answer told
// the epoch of lately, those away among them: a server back from an
// outage, maybe empty, is handed the parkings this process holds before
// its next probe would find it, and a newcomer would meet it empty.
func (l *Limiter) checkEpochs() {
	since := int64(time.Since(l.start))
	for _, srv := range l.servers {
		if srv.marker == "" || since-srv.epochAt.Load() < int64(epochEvery) {
			continue
		}
		if srv.down.Load() {
			srv.epochAt.Store(since) // a failure says nothing new: once per epochEvery
		}
		known, _ := srv.known.Load().(string)
		res, err := l.run(l.ctx, srv, epochScript, []string{srv.marker}, known, l.win)
		if err != nil || len(res) < 1 {
			if err != nil && !permanent(err) && l.ctx.Err() == nil && !srv.down.Load() {
				l.fail(srv, err)
			}
			continue
		}
		l.answered(srv)
		l.seenEpoch(srv, res[0])
	}
}

// setClaimed records whether this process holds a claim on host. The
// caller holds host's shard's lock.
func (m *memory) setClaimed(host string, held bool) {
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	if !held {
		delete(m.claimed, host)
		return
	}
	if m.claimed == nil {
		m.claimed = make(map[string]struct{})
	}
	m.claimed[host] = struct{}{}
}

// claims is how many hosts this process holds a claim on.
func (m *memory) claims() int {
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	return len(m.claimed)
}

// idle returns the claims to give back at now: those of hosts the process
// has not wanted since it last gave itself time to call again, on servers
// that answer. Claims that ended by themselves are forgotten.
func (m *memory) idle(now time.Time, down func(string) bool) []goodbye {
	var out []goodbye
	for _, host := range m.claimedHosts() {
		if down(host) {
			continue
		}
		s := m.shard(host)
		s.mu.Lock()
		switch h := s.hosts[host]; {
		case h == nil || !h.claim || !now.Before(h.claimEnd):
			if h != nil {
				h.claim = false
			}
			m.setClaimed(host, false)
		case !now.Before(later(later(h.lastCall, h.demand), later(h.slots, h.own)).Add(h.dl)):
			// Not called since its last call gave it time to, nor since
			// the last slot it holds came, from Redis or in process: a
			// request waiting for its slot still wants the host. (Not the
			// slots in process once: in a lane after a restart, a process
			// whose requests waited for them gave its claim back 100 ms
			// after its last call, and waited out the lane holding no
			// share, TestBucketOutlivesData's processes one by one.)
			out = append(out, goodbye{host, h.deadline})
		}
		s.mu.Unlock()
	}
	return out
}

// claimedHosts is a copy of the hosts this process holds claims on, so
// that each host's shard is locked without the claims' lock held.
func (m *memory) claimedHosts() []string {
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	hosts := make([]string, 0, len(m.claimed))
	for h := range m.claimed {
		hosts = append(hosts, h)
	}
	return hosts
}

// slot records that Redis gave this process a slot for host at at.
func (m *memory) slot(host string, at time.Time) {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil {
		return
	}
	if at.After(h.slots) {
		h.slots = at
	}
	// Earliest first; when full, the latest goes: prepare needs the
	// earliest.
	i := len(h.pend)
	for i > 0 && h.pend[i-1].After(at) {
		i--
	}
	if i >= pendMax {
		return
	}
	if len(h.pend) < pendMax {
		h.pend = append(h.pend, time.Time{})
	}
	copy(h.pend[i+1:], h.pend[i:])
	h.pend[i] = at
}

// pendMax bounds the slots from Redis still to come that a host's entry
// keeps.
const pendMax = 8

// held returns every claim this process holds on a server that answers.
func (m *memory) held(down func(string) bool) []goodbye {
	var out []goodbye
	for _, host := range m.claimedHosts() {
		if down(host) {
			continue
		}
		s := m.shard(host)
		s.mu.Lock()
		if h := s.hosts[host]; h != nil && h.claim {
			out = append(out, goodbye{host, h.deadline})
		}
		s.mu.Unlock()
	}
	return out
}

// left records a goodbye Redis answered: the claim is no longer held,
// unless Redis kept it, holding deadline held (a call renewed it; -1: no
// claim at all). A claim kept with a deadline this process did not hear of
// (the call's answer was lost) is given back at the next goodbye, if the
// process is still idle then.
func (m *memory) left(host string, deadline, held int64) {
	s := m.shard(host)
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hosts[host]
	if h == nil || !h.claim || h.deadline != deadline {
		return // renewed meanwhile, by an answer heard since
	}
	if held > 0 {
		h.deadline = held
		return
	}
	h.claim = false
	m.setClaimed(host, false)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
