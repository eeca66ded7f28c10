package retryotel

import (
	"container/list"
	"sync"

	"go.opentelemetry.io/otel/attribute"
)

// hostSet is the most recently seen hosts, at most max of them, so that the
// pace gauge of a crawler keeps a bounded number of series and of HostPace
// calls per collection. It also keeps each host's attributes, made once.
type hostSet struct {
	mu    sync.Mutex
	max   int
	hosts map[host]*list.Element // of *hostEntry
	order list.List              // the most recent first
}

type hostEntry struct {
	host   host
	target string // for Transport.HostPace
	attrs  []attribute.KeyValue
}

func newHostSet(max int) *hostSet {
	return &hostSet{max: max, hosts: make(map[host]*list.Element)}
}

// see notes h as the most recent host, forgetting the least recent one
// beyond max, and returns its attributes, which the caller must not change.
func (s *hostSet) see(h host) []attribute.KeyValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.hosts[h]; ok {
		s.order.MoveToFront(e)
		return e.Value.(*hostEntry).attrs
	}
	if len(s.hosts) >= s.max {
		last := s.order.Back()
		delete(s.hosts, last.Value.(*hostEntry).host)
		s.order.Remove(last)
	}
	he := &hostEntry{host: h, target: h.target(), attrs: h.attrs()}
	s.hosts[h] = s.order.PushFront(he)
	return he.attrs
}

// list returns the hosts, the most recent first; the entries are shared and
// never changed.
func (s *hostSet) list() []*hostEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*hostEntry, 0, len(s.hosts))
	for e := s.order.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*hostEntry))
	}
	return out
}
