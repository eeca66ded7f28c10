package redislimit

import (
	"errors"
	"hash/fnv"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is one Redis server the Limiter keeps hosts on: the client's
// (a single server, a failover pair, a whole Cluster), or one shard of a
// Ring. Each fails and comes back on its own, may lose its data on its
// own, and has a clock of its own.
type server struct {
	name string // the shard's name in the Ring; "" for the client's
	addr string // the shard's address, to find its client in the Ring
	// key is, in a Cluster, a key of the server's slot, to ask the client
	// which node holds it; master that node's address when the slot last
	// failed (guarded by the Limiter's slotMu).
	key    string
	master string
	c      redis.Scripter // the client; nil for a Ring shard, found by addr
	marker string         // the epoch marker's key; "" with a Cluster
	// markerArg is marker boxed once for the reserve calls; nil when ""
	markerArg any

	down    atomic.Bool  // pacing in process: the server failed and has not answered since
	probeAt atomic.Int64 // when down: the next call to try it, in ns since the Limiter's start
	downAt  atomic.Int64 // when it last failed after answering, in ns since start
	// epoch is the server's epoch as last seen (see epochLua), 0 before
	// any answer; epochAt when it was last seen, in ns since start.
	epoch    atomic.Int64
	known    atomic.Value // epoch as the string the scripts are given
	epochAt  atomic.Int64
	flushing atomic.Bool // a hand-over of parkings to it is under way
	// lastRTT is the round trip of the latest call it answered, and
	// peakRTT the longest of the latest few (see answeredIn), in ns.
	// slow: it last failed by not answering in time after answering near
	// the bound (a link about as slow as the timeout, or with a tail past
	// it; not a freeze nor a stop on a fast one); inTime counts the probes
	// answered within half the timeout in a row since. See
	// Limiter.answeredFor.
	lastRTT atomic.Int64
	peakRTT atomic.Int64
	slow    atomic.Bool
	inTime  atomic.Int32
	clock   clockEstimate
}

// answeredIn records the round trip of a call the server answered. The
// peak forgets an eighth of itself with each answer, so that it tells the
// link's recent worst, a few calls long, not a single spike long ago.
func (s *server) answeredIn(rtt time.Duration) {
	s.lastRTT.Store(int64(rtt))
	for {
		cur := s.peakRTT.Load()
		next := max(int64(rtt), cur-cur/8)
		if s.peakRTT.CompareAndSwap(cur, next) {
			return
		}
	}
}

// A Ring moves a dead shard's keys to the shards left, where nothing is
// known of them: a parked host opens, a paced host's bucket is full. So
// the Limiter places each host on a shard of its own choosing, among all
// the shards the Ring was made with, up or not (rendezvous hashing of the
// host's key over the shards' names, the same in every process). A shard
// that dies is then an outage for its hosts, and one that comes back
// empty a server that lost its data: both of which the Limiter paces
// through as with a single server.

// newServers returns the servers of rdb: a Ring's shards, by name, or the
// client's one server. Only a Cluster has no epoch marker: its scripts
// reach one slot.
func newServers(rdb redis.UniversalClient, prefix string) []*server {
	out := serversOf(rdb, prefix)
	for _, s := range out {
		if s.marker != "" {
			s.markerArg = s.marker
		}
	}
	return out
}

func serversOf(rdb redis.UniversalClient, prefix string) []*server {
	switch c := rdb.(type) {
	case nil:
		return []*server{{}}
	case *redis.Ring:
		addrs := c.Options().Addrs
		names := make([]string, 0, len(addrs))
		for name := range addrs {
			names = append(names, name)
		}
		sort.Strings(names)
		out := make([]*server, len(names))
		for i, name := range names {
			out[i] = &server{name: name, addr: addrs[name], marker: prefix + epochKey}
		}
		if len(out) == 0 {
			return []*server{{c: rdb, marker: prefix + epochKey}}
		}
		return out
	case *redis.ClusterClient:
		return nil // one per hash slot, made when first used: see slotServer
	}
	return []*server{{c: rdb, marker: prefix + epochKey}}
}

// epochKey ends the name of each server's epoch marker.
const epochKey = "\x00epoch"

// serverFor returns the server that holds key.
func (l *Limiter) serverFor(key string) *server {
	if l.slots != nil {
		return l.slotServer(l.prefix + key)
	}
	if len(l.servers) == 1 {
		return l.servers[0]
	}
	var best *server
	var top uint64
	for _, s := range l.servers {
		h := fnv.New64a()
		h.Write([]byte(s.name))
		h.Write([]byte{0})
		h.Write([]byte(key))
		if v := h.Sum64(); best == nil || v > top {
			best, top = s, v
		}
	}
	return best
}

// errShardGone is a Ring shard the Ring no longer lists (down since the
// Limiter started, or removed): its hosts are paced in process.
var errShardGone = errors.New("redislimit: Ring shard unavailable")

// client returns the client to call s with.
func (l *Limiter) client(s *server) (redis.Scripter, error) {
	if s.c != nil {
		return s.c, nil
	}
	return l.shards.get(l.rdb.(*redis.Ring), s.addr)
}

// shardClients finds a Ring's shard clients by address. The Ring lists
// only the shards it sees up, so each client found is kept: a shard that
// dies is then called as it is, and fails as a server that died, and one
// that comes back is used again at once.
type shardClients struct {
	mu sync.Mutex
	m  map[string]*redis.Client
}

func (sc *shardClients) get(r *redis.Ring, addr string) (*redis.Client, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if c := sc.m[addr]; c != nil {
		return c, nil
	}
	if sc.m == nil {
		sc.m = make(map[string]*redis.Client)
	}
	for _, c := range r.GetShardClients() {
		sc.m[c.Options().Addr] = c
	}
	if c := sc.m[addr]; c != nil {
		return c, nil
	}
	return nil, errShardGone
}

// clockEstimate bounds the offset between a server's clock and the
// Limiter's monotonic clock, so that a call can carry a moment on the
// server's clock after which it is stale. Each answer gives an upper bound
// of the offset, the server's time less the moment the call was sent: the
// least of those of the last 10 to 20 s is the estimate (the server's
// clock may drift or be stepped), and a call found stale though answered
// in time corrects it at once.
type clockEstimate struct {
	mu        sync.Mutex
	cur, prev int64 // least bound of the current window and of the previous one; 0: none
	from      int64 // start of the current window, µs since the Limiter's start
	rtt       int64 // the round trip of the call that gave cur, µs
}

const clockWindow = 10 * time.Second

// offset returns the estimate and the round trip of the answer it came
// from, or false when there is none yet.
func (c *clockEstimate) offset() (int64, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.cur == 0 && c.prev == 0:
		return 0, 0, false
	case c.prev == 0 || (c.cur != 0 && c.cur < c.prev):
		return c.cur, c.rtt, true
	}
	return c.prev, c.rtt, true
}

// sample records an answer from the server at its time redisNow to a call
// sent at sent and answered at got (µs since the Limiter's start).
func (c *clockEstimate) sample(sent, got, redisNow int64) {
	bound := redisNow - sent
	c.mu.Lock()
	defer c.mu.Unlock()
	if got-c.from >= us(clockWindow) {
		c.prev, c.cur, c.from = c.cur, 0, got
	}
	if c.cur == 0 || bound < c.cur {
		c.cur, c.rtt = bound, got-sent
	}
}

// reset replaces the estimate by one answer's: the earlier ones are wrong
// (the server's clock was stepped forward).
func (c *clockEstimate) reset(sent, got, redisNow int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur, c.prev, c.from, c.rtt = redisNow-sent, 0, got, got-sent
}
