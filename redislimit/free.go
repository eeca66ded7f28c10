package redislimit

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
)

// A host with no pace needs nothing from Redis unless it is parked, held
// down by some process, or has a pace learned: most of the time, nothing.
// Once Redis said so for a host, the Limiter answers its requests at once
// from that, and learns of changes off the requests' path: parkings come
// through the subscription; the rest (a down mark, a learned pace, a
// parking the subscription missed) from a small read-only script it runs
// on its own goroutine, at most once per freeRefresh per host while the
// host is used. A request to such a host so never waits on Redis, but
// for the first the process sends to it, and for those after its own
// failures or refusals, which Redis must hear of anyway.
const (
	// freeRefresh is how often what Redis holds of a free host is read
	// again while the host is used.
	freeRefresh = 250 * time.Millisecond
	// freeStale is how old that may be and still be trusted without a
	// subscription known to deliver since.
	freeStale = time.Second
)

// freeHost is what the Limiter last learnt of a host with no pace.
type freeHost struct {
	free       atomic.Bool  // Redis said the host needs nothing
	at         atomic.Int64 // when, in ns since the Limiter's start
	sub        atomic.Int64 // the subscription's generation then
	refreshing atomic.Bool
}

// freeHosts holds a freeHost per host, for at most freeMax hosts: past
// that the whole set is dropped and a new one started (a crawler meets a
// host, and moves on), so that its memory is bounded whatever the number
// of hosts. A host dropped asks Redis with its next request, once.
type freeHosts struct {
	m atomic.Pointer[sync.Map] // host → *freeHost; nil: none yet
	n atomic.Int64             // entries added to m
}

// freeMax bounds the hosts whose freedom is remembered: the core's own
// bound on the hosts it keeps.
const freeMax = 8192

func (f *freeHosts) load(host string) (*freeHost, bool) {
	m := f.m.Load()
	if m == nil {
		return nil, false
	}
	v, ok := m.Load(host)
	if !ok {
		return nil, false
	}
	return v.(*freeHost), true
}

func (f *freeHosts) get(host string) *freeHost {
	if e, ok := f.load(host); ok {
		return e
	}
	m := f.m.Load()
	if m == nil || f.n.Add(1) > freeMax {
		m = new(sync.Map)
		f.m.Store(m)
		f.n.Store(1)
	}
	v, _ := m.LoadOrStore(host, &freeHost{})
	return v.(*freeHost)
}

// forget makes the next request to host ask Redis.
func (f *freeHosts) forget(host string) {
	if e, ok := f.load(host); ok {
		e.free.Store(false)
	}
}

// freeReserve answers a request with no pace to host from what Redis said
// of it lately, when that was nothing, and refreshes it in the background
// when due. It reports false when the request must ask Redis.
func (l *Limiter) freeReserve(srv *server, a retryhttp.Attempt) bool {
	e, ok := l.free.load(a.Host)
	if !ok || !e.free.Load() {
		return false
	}
	age := time.Since(l.start) - time.Duration(e.at.Load())
	if g := l.sub.Load(); age >= freeStale && (g <= 0 || e.sub.Load() != g) {
		return false
	}
	if age >= freeRefresh && e.refreshing.CompareAndSwap(false, true) {
		host := a.Host
		if !l.spawn(func() { l.refreshFree(srv, host, e) }) {
			e.refreshing.Store(false)
		}
	}
	return true
}

// heardFree records what an answer of Redis to a request with no pace
// said of host.
func (l *Limiter) heardFree(host string, res []int64) {
	e := l.free.get(host)
	// Nothing taken, nothing to wait, no pace learned.
	free := res[0] == codeTaken && res[1] == 0 && res[6] == 0
	e.at.Store(int64(time.Since(l.start)))
	e.sub.Store(l.sub.Load())
	e.free.Store(free)
}

// refreshFree reads what Redis holds of the free host e.
func (l *Limiter) refreshFree(srv *server, host string, e *freeHost) {
	defer e.refreshing.Store(false)
	if !l.useRedis(srv) || srv.down.Load() {
		return
	}
	g := l.sub.Load()
	start := time.Now()
	res, err := l.run(l.ctx, srv, watchScript, []string{l.prefix + host})
	if err == nil && len(res) < 2 {
		err = fmt.Errorf("redislimit: unexpected answer from the watch script: %v", res)
	}
	if err != nil {
		if !permanent(err) && l.ctx.Err() == nil {
			l.fail(srv, err)
		}
		return
	}
	l.answered(srv)
	e.at.Store(int64(time.Since(l.start)))
	e.sub.Store(g)
	switch res[0] {
	case codeTaken:
		e.free.Store(true)
	case codeParked:
		l.mem.park(host, start.Add(time.Duration(res[1])*time.Microsecond))
		l.keepOn()
		e.free.Store(false)
	default: // down, or a pace learned: the requests ask Redis
		e.free.Store(false)
	}
}

// watchLua reads what a request with no pace needs of its host: {2,
// rest} when it is parked, {7, rest} when a process holds it down, {8, 0}
// when a pace is learned or being learned, else {0, 0}. It writes
// nothing.
const watchLua = `
local v = redis.call('HMGET', KEYS[1], 'p', 'dn', 'st', 'r')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local p, dn = tonumber(v[1]), tonumber(v[2])
if p and p > now then return {2, p - now} end
if dn and dn > now then return {7, dn - now} end
if v[3] or v[4] then return {8, 0} end
return {0, 0}
`

var watchScript = redis.NewScript(watchLua)
