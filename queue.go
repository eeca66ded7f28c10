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

// is reports whether the waiter is the one that waited on ch.
func (w *waiter) is(ch <-chan struct{}) bool { return ch != nil && w.ch == ch }

// enqueue puts a request at the end of those waiting for a slot in flight.
func (m *hostModel) enqueue() *waiter {
	w := &waiter{ch: make(chan struct{})}
	m.queue = append(m.queue, w)
	return w
}

// wake hands the slots in flight that are free to the waiters, first come
// first served, and lets every waiter ask again when the host is no longer
// held to a limit in flight (or is down).
func (m *hostModel) wake(now instant) {
	m.expireKept(now)
	for len(m.queue) > 0 {
		w := m.queue[0]
		if !w.gone {
			if m.ctl.limit > 0 && m.state != HostDown {
				if m.inflight >= m.ctl.limit {
					return
				}
				w.ticket, w.at = m.send(now), now
				m.kept = append(m.kept, w)
			}
			close(w.ch)
		}
		m.queue[0] = nil
		m.queue = m.queue[1:]
	}
}

// releaseAll lets every waiter ask again, keeping no slot: the record is
// being forgotten.
func (m *hostModel) releaseAll() {
	for _, w := range m.queue {
		if !w.gone {
			close(w.ch)
		}
	}
	m.queue, m.kept = nil, nil
}

// collect hands a waiter the slot kept for it, if one was: its ticket, or
// 0.
func (m *hostModel) collect(ch <-chan struct{}) uint64 {
	for i, w := range m.kept {
		if w.is(ch) {
			m.kept = slices.Delete(m.kept, i, i+1)
			return w.ticket
		}
	}
	return 0
}

// cancelWait takes a waiter that stopped waiting out of the queue, and
// frees the slot kept for it, if one was.
func (m *hostModel) cancelWait(w *waiter, now instant) {
	w.gone = true
	if i := slices.Index(m.kept, w); i >= 0 {
		m.kept = slices.Delete(m.kept, i, i+1)
		m.release(w.ticket)
		m.wake(now)
	}
}

// expireKept frees the slots kept for waiters that did not come for them
// within a hold (a Limiter shared with a Transport that never asks again).
func (m *hostModel) expireKept(now instant) {
	for i := 0; i < len(m.kept); {
		if w := m.kept[i]; now.Sub(w.at) >= holdTime {
			m.kept = slices.Delete(m.kept, i, i+1)
			m.release(w.ticket)
			continue
		}
		i++
	}
}
