package retryhttp

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// The learned hedge delay (WithHedging(0)) needs each host's recent
// latencies. They are kept here, by the Transport, and not in the host
// model behind the Limiter: a host that never failed has no model and
// costs nothing (R13), and a call that is answered before its delay pays
// for a hash, a clock reading and a few atomic operations, not for the
// Limiter's Reserve and Learn, which took a shard's lock and made the host
// a model of its own just to hold its latencies.
//
// The table is fixed: latencySlots records, each host hashed to two of
// them, so that memory is bounded by the table, not by the hosts a crawler
// meets (R20). A host takes a free slot, else the less recently seen of its
// two; a host that loses its slot, or is quiet past latencyForget, starts
// again from hedgeStart.

// latencySlots is how many hosts' latencies a Transport keeps at most:
// about 600 bytes each, 150 KiB in all, made once.
const latencySlots = 256

// latencySample is how many calls to a host share one timing once its
// ring is full: the 64 latencies then span the last 256 calls or so, and a
// call answered before its delay saves a clock reading and the ring's
// update three times in four, most of what learning the delay cost it.
// Which calls are timed is set by a count, not by the answers, so that the
// 95th percentile of those timed is the host's: a hung call is as likely
// to be timed as a quick one. A busy host's ring is renewed every few
// seconds all the same; a host with few calls was timed on each of its
// first 64, and the one in four then covers the minute it is kept
// (latencyForget) after just 16 more.
const latencySample = 4

// latencyForget is how long a host's latencies count after its last
// answer: a host quiet for longer may have changed, and is hedged as one
// never seen, as the host model forgets it (forgetAfter).
const latencyForget = time.Minute

// latencyTable is a Transport's hosts' recent latencies, for the learned
// hedge delay. It takes no lock: slots are claimed and replaced by
// compare-and-swap, and a record's values are atomic.
type latencyTable struct {
	seed  maphash.Seed
	slots [latencySlots]atomic.Pointer[hostLatencies]
}

// hostLatencies is one host's last 64 answer latencies, in a ring, and
// their 95th percentile, worked out again every eighth answer.
type hostLatencies struct {
	host string
	slot int // where it was put, to tell whether it still is
	ring [64]atomic.Int64
	n    atomic.Uint64 // answers recorded
	// calls counts the calls that found it full, to time one in
	// latencySample of them (timed).
	calls atomic.Uint64
	p95   atomic.Int64
	seen  atomic.Int64 // when the last was recorded, in Unix nanoseconds
}

func newLatencyTable() *latencyTable {
	return &latencyTable{seed: maphash.MakeSeed()}
}

// places returns the two slots host may hold.
func (lt *latencyTable) places(host string) (int, int) {
	h := maphash.String(lt.seed, host)
	i, j := int(h%latencySlots), int((h>>32)%latencySlots)
	if i == j {
		j = (i + 1) % latencySlots
	}
	return i, j
}

// lookup returns host's record, nil when it has none.
func (lt *latencyTable) lookup(host string) *hostLatencies {
	i, j := lt.places(host)
	if r := lt.slots[i].Load(); r != nil && r.host == host {
		return r
	}
	if r := lt.slots[j].Load(); r != nil && r.host == host {
		return r
	}
	return nil
}

// p95 is the 95th percentile of host's recent latencies at now, 0 when
// none are known or the host has been quiet past latencyForget.
func (lt *latencyTable) p95(host string, now time.Time) time.Duration {
	p, _ := lt.find(host, now)
	return p
}

// find is p95, and host's record, for the answer to be added to it (nil
// when it has none).
func (lt *latencyTable) find(host string, now time.Time) (time.Duration, *hostLatencies) {
	r := lt.lookup(host)
	if r != nil && now.UnixNano()-r.seen.Load() <= int64(latencyForget) {
		return time.Duration(r.p95.Load()), r
	}
	return 0, r
}

// timed reports whether a call that found p95 in r is to be timed for it:
// each while r is new or has no percentile (a host never seen, or quiet
// past latencyForget: its answers make it anew), else one in
// latencySample.
func (r *hostLatencies) timed(p95 time.Duration) bool {
	if r == nil || p95 <= 0 || r.n.Load() < uint64(len(r.ring)) {
		return true
	}
	return r.calls.Add(1)%latencySample == 0
}

// add records an answer's latency d from host, at now, in r when it is
// host's record already.
func (lt *latencyTable) add(host string, r *hostLatencies, d time.Duration, now time.Time) {
	if r == nil || r != lt.slots[r.slot].Load() {
		if r = lt.lookup(host); r == nil {
			r = lt.claim(host)
		}
	}
	if r.n.Load() > 0 && now.UnixNano()-r.seen.Load() > int64(latencyForget) {
		// Quiet past the forget time: its old latencies say nothing now.
		fresh := &hostLatencies{host: host, slot: r.slot}
		lt.slots[r.slot].CompareAndSwap(r, fresh)
		r = fresh
	}
	r.seen.Store(now.UnixNano())
	n := r.n.Add(1)
	r.ring[(n-1)%uint64(len(r.ring))].Store(int64(d))
	if n <= 8 || n%8 == 0 {
		r.p95.Store(int64(r.percentile95(n)))
	}
}

// claim gives host a record in one of its slots: a free one, or else the
// one seen less lately. Two callers claiming at once each get a record; one of them is
// kept, and the other's answer is lost, which costs nothing but that
// answer.
func (lt *latencyTable) claim(host string) *hostLatencies {
	i, j := lt.places(host)
	a, b := lt.slots[i].Load(), lt.slots[j].Load()
	if b == nil || (a != nil && b.seen.Load() < a.seen.Load()) {
		i, a = j, b
	}
	r := &hostLatencies{host: host, slot: i}
	lt.slots[i].CompareAndSwap(a, r)
	return r
}

// percentile95 is the 95th percentile of the last min(n, 64) latencies:
// the k-th largest, k at most 4, found in one pass.
func (r *hostLatencies) percentile95(n uint64) time.Duration {
	size := int(min(n, uint64(len(r.ring))))
	k := size - (size*95+99)/100 + 1 // the k-th largest is the 95th percentile
	var top [4]int64                 // the k largest so far, largest first
	for i := range size {
		v := r.ring[i].Load()
		if v <= top[k-1] {
			continue // most are: one comparison
		}
		for p := range k {
			if v > top[p] {
				copy(top[p+1:k], top[p:k-1])
				top[p] = v
				break
			}
		}
	}
	return time.Duration(top[k-1])
}
