package retryhttp

import (
	"slices"
)

// The order in which the requests waiting for a slot in flight are
// served: first come, first served, so that no request waits behind those
// that came after it. A waiter waits on its channel: a slot that frees is
// kept for the first waiter (its ticket taken for it), and the channel
// closed; the waiter collects the slot when it asks again
// (Attempt.Waited).

// waiter is a request waiting for a slot in flight.
type waiter struct {
	ch     chan struct{} // closed when it may ask again
	ticket uint64        // the slot in flight kept for it; 0: none
	at     instant       // when the slot was kept
	gone   bool          // it stopped waiting
}

// waitQueue is the requests waiting for a slot in flight, in the order
// they came, and those a slot is kept for. A record has one only once a
// request waited: most never hold a limit in flight.
type waitQueue struct {
	queue []*waiter
	kept  []*waiter
}

// waiting reports whether requests wait for a slot in flight.
func (m *hostModel) waiting() bool { return m.wq != nil && len(m.wq.queue) > 0 }

// is reports whether the waiter is the one that waited on ch.
func (w *waiter) is(ch <-chan struct{}) bool { return ch != nil && w.ch == ch }

// enqueue puts a request at the end of those waiting for a slot in flight.
func (m *hostModel) enqueue() *waiter {
	w := &waiter{ch: make(chan struct{})}
	if m.wq == nil {
		m.wq = new(waitQueue)
	}
	m.wq.queue = append(m.wq.queue, w)
	return w
}

// wake hands the slots in flight that are free to the waiters, first come
// first served, and lets every waiter ask again when the host is no longer
// held to a limit in flight (or is down).
func (m *hostModel) wake(now instant) {
	if m.wq == nil {
		return
	}
	m.expireKept(now)
	for len(m.wq.queue) > 0 {
		w := m.wq.queue[0]
		if !w.gone {
			if m.ctl.limit > 0 && m.state != HostDown {
				if m.busy() >= m.ctl.limit {
					return
				}
				w.ticket, w.at = m.send(now), now
				m.wq.kept = append(m.wq.kept, w)
			}
			close(w.ch)
		}
		m.wq.queue[0] = nil
		m.wq.queue = m.wq.queue[1:]
	}
}

// releaseAll lets every waiter ask again, keeping no slot: the record is
// being forgotten.
func (m *hostModel) releaseAll() {
	if m.wq == nil {
		return
	}
	for _, w := range m.wq.queue {
		if !w.gone {
			close(w.ch)
		}
	}
	m.wq.queue, m.wq.kept = nil, nil
}

// collect hands a waiter the slot kept for it, if one was: its ticket, or
// 0.
func (m *hostModel) collect(ch <-chan struct{}) uint64 {
	if m.wq == nil {
		return 0
	}
	for i, w := range m.wq.kept {
		if w.is(ch) {
			m.wq.kept = slices.Delete(m.wq.kept, i, i+1)
			return w.ticket
		}
	}
	return 0
}

// cancelWait takes a waiter that stopped waiting out of the queue, and
// frees the slot kept for it, if one was.
func (m *hostModel) cancelWait(w *waiter, now instant) {
	w.gone = true
	if i := slices.Index(m.wq.kept, w); i >= 0 {
		m.wq.kept = slices.Delete(m.wq.kept, i, i+1)
		m.release(w.ticket)
		m.wake(now)
	}
}

// expireKept frees the slots kept for waiters that did not come for them
// within a hold (a Limiter shared with a Transport that never asks again).
func (m *hostModel) expireKept(now instant) {
	for i := 0; i < len(m.wq.kept); {
		if w := m.wq.kept[i]; now.Sub(w.at) >= holdTime {
			m.wq.kept = slices.Delete(m.wq.kept, i, i+1)
			m.release(w.ticket)
			continue
		}
		i++
	}
}
