package redislimit

import (
	"fmt"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
)

// The in-process pacer holds only the hosts active lately: a crawler of
// many hosts does not grow it without bound, and a host still parked or
// paced is never forgotten.
func TestMemoryBounded(t *testing.T) {
	var m memory
	now := time.Now()
	p := retryhttp.Pace{Limit: 1000, Burst: 1} // a host is idle 1 ms after its slot
	m.park("parked.test", now.Add(time.Hour))
	slow := retryhttp.Pace{Limit: 1.0 / 3600, Burst: 1}
	m.reserve(retryhttp.Attempt{Host: "paced.test", Pace: slow, Now: now}, slow, share{})
	const hosts = 100_000
	for i := range hosts {
		at := now.Add(time.Duration(i) * time.Millisecond)
		m.reserve(retryhttp.Attempt{Host: fmt.Sprintf("h%d.test", i), Pace: p, Now: at}, p, share{})
		// A parking of a host far away in time must not sweep as of then.
		if i%1000 == 0 {
			m.park(fmt.Sprintf("far%d.test", i), at.Add(time.Second))
		}
	}
	total := 0
	for i := range m.shards {
		total += len(m.shards[i].hosts)
	}
	if total > 4*memSweep*memShards {
		t.Errorf("%d hosts held after %d, want at most %d", total, hosts, 4*memSweep*memShards)
	}
	end := now.Add(hosts * time.Millisecond)
	if _, ok := m.parkedUntil("parked.test", end); !ok {
		t.Errorf("a parked host was forgotten")
	}
	s := m.shard("paced.test")
	if h := s.hosts["paced.test"]; h == nil || !h.tat.After(end) {
		t.Errorf("a host with an hour's pace was forgotten")
	}
}

func TestGCRABounds(t *testing.T) {
	for _, c := range []struct {
		p        retryhttp.Pace
		interval time.Duration
		burst    int
	}{
		{retryhttp.Pace{Limit: 20, Burst: 1}, 50 * time.Millisecond, 1},
		{retryhttp.Pace{Limit: 3, Burst: 0}, 333334 * time.Microsecond, 1}, // rounded up
		{retryhttp.Pace{Limit: 1e9, Burst: 5}, time.Microsecond, 5},
		{retryhttp.Pace{Limit: 1e-9, Burst: 2e6}, time.Hour, maxBurst},
	} {
		interval, burst := gcra(c.p)
		if interval != c.interval || burst != c.burst {
			t.Errorf("gcra(%+v) = %v, %d; want %v, %d", c.p, interval, burst, c.interval, c.burst)
		}
	}
}
