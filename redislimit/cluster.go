package redislimit

import (
	"strings"
	"time"
)

// A Redis Cluster is many servers, not one: a master that dies is an
// outage for the hosts whose keys its slots hold, and for those alone.
// So with a *redis.ClusterClient the Limiter keeps one server per hash
// slot, made when a host of that slot is first met, each failing and
// coming back on its own; a host on a healthy master is never paced in
// process for another master's death.
//
// go-redis learns a Cluster's slot map from MOVED and READONLY answers,
// and otherwise every ClusterStateReloadInterval (60 s by default). A
// master killed answers nothing, so nothing tells go-redis of its
// replica's promotion: its calls go on to the dead address. While a slot
// is failing, the Limiter therefore asks go-redis to reload the map every
// clusterWatch, and as soon as the slot's master is another than the one
// that failed, probes it at once rather than at the next probe interval;
// a slot on which this process holds parkings is probed by handing them
// over, so that a parking learnt while the master was dead reaches the
// new one though no request goes to the parked host.

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// clusterWatch is how often the slot map is reloaded while a slot fails.
const clusterWatch = 100 * time.Millisecond

// slotServer returns the server of key's hash slot.
func (l *Limiter) slotServer(key string) *server {
	p := &l.slots[keySlot(key)]
	if s := p.Load(); s != nil {
		return s
	}
	s := &server{c: l.rdb, key: key}
	if p.CompareAndSwap(nil, s) {
		return s
	}
	return p.Load()
}

// slotFailed records, for a Cluster, that srv's slot failed: which master
// it failed on, and starts the watch of the slot map.
func (l *Limiter) slotFailed(srv *server) {
	if l.cluster == nil {
		return
	}
	l.slotMu.Lock()
	_, known := l.failing[srv]
	l.slotMu.Unlock()
	if known {
		return
	}
	addr := l.masterOf(srv)
	l.slotMu.Lock()
	if _, known = l.failing[srv]; !known {
		srv.master = addr
		l.failing[srv] = struct{}{}
	}
	l.slotMu.Unlock()
	l.cluster.ReloadState(l.ctx)
	if l.watching.CompareAndSwap(false, true) && !l.spawn(l.watchSlots) {
		l.watching.Store(false)
	}
}

// slotAnswered records that srv's slot answers again.
func (l *Limiter) slotAnswered(srv *server) {
	if l.cluster == nil {
		return
	}
	l.slotMu.Lock()
	delete(l.failing, srv)
	l.slotMu.Unlock()
}

// masterOf is the address of the master that go-redis's slot map gives
// srv's slot just now; "" when it has none.
func (l *Limiter) masterOf(srv *server) string {
	c, err := l.cluster.MasterForKey(l.ctx, srv.key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// watchSlots runs while a slot fails: it reloads the slot map, probes
// at once each failing slot whose master changed, and hands the parkings
// this process holds to the failing slots whose probe is due.
func (l *Limiter) watchSlots() {
	t := time.NewTicker(clusterWatch)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			l.watching.Store(false)
			return
		case <-t.C:
		}
		l.slotMu.Lock()
		failing := make([]*server, 0, len(l.failing))
		for s := range l.failing {
			if s.down.Load() {
				failing = append(failing, s)
			} else {
				delete(l.failing, s)
			}
		}
		l.slotMu.Unlock()
		if len(failing) == 0 {
			l.watching.Store(false)
			l.slotMu.Lock()
			n := len(l.failing)
			l.slotMu.Unlock()
			if n == 0 || !l.watching.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		l.cluster.ReloadState(l.ctx)
		for _, s := range failing {
			l.slotMu.Lock()
			was := s.master
			l.slotMu.Unlock()
			if now := l.masterOf(s); was == "" || now != was {
				l.slotMu.Lock()
				s.master = now
				l.slotMu.Unlock()
				// A new master: the next call to the slot probes it.
				if was != "" {
					s.probeAt.Store(int64(time.Since(l.start)))
				}
			}
			l.handOver(s)
		}
	}
}

// handOver probes the failing slot srv, when its probe is due, with the
// parkings this process holds on it: a parked host sends no request, so
// without this nothing would reach the slot's new master.
func (l *Limiter) handOver(srv *server) {
	var hosts []string
	var rests []time.Duration
	for host, until := range l.mem.parkings(time.Now()) {
		if l.serverFor(host) == srv {
			hosts, rests = append(hosts, host), append(rests, time.Until(until))
		}
	}
	if len(hosts) == 0 || !l.useRedis(srv) {
		return
	}
	i := 0
	for i < len(hosts)-1 && rests[i] <= 0 {
		i++
	}
	if err := l.parkRedis(l.ctx, srv, hosts[i], max(rests[i], time.Microsecond)); err != nil {
		if !permanent(err) && l.ctx.Err() == nil {
			l.fail(srv, err)
		}
		return
	}
	l.answered(srv) // hands over the rest, on a goroutine of its own
}

// keySlot is the Redis Cluster hash slot of key: CRC16 of its hash tag,
// the part between the first "{" and the next "}" when not empty, or else
// of the whole key.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
}

// crc16 is CRC-16/XMODEM, the one Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
