package redislimit_test

import (
	"testing"
	"time"

	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// TestLinkNearTimeout: replies taking 30-80 ms, around the default 50 ms
// timeout, for three processes at a shared 20/s: about half the calls
// answer in time. A process that fell back on timeouts goes back to Redis
// only on a probe answered well within the timeout, or on three in a row
// answered in time, so that it does not flip between Redis and its
// fallback, paying the switch each time: the pace holds within 10 %, with
// at most one burst above it.
func TestLinkNearTimeout(t *testing.T) {
	t.Parallel()
	srv := redistest.StartT(t)
	host := newFleetHost(t)
	const slow, total = 2 * time.Second, 8 * time.Second
	var members []*member
	var proxies []*redistest.Proxy
	for range 3 {
		p := redistest.StartProxy(t, srv.Addr)
		proxies = append(proxies, p)
		members = append(members, &member{addr: p.Addr, opts: []redislimit.Option{redislimit.WithTimeout(redislimit.DefaultTimeout)}})
	}
	start := runFleet(t, host, testPrefix(t), total, members, event{slow, func() error {
		for _, p := range proxies {
			p.SetLatency(30*time.Millisecond, 80*time.Millisecond)
		}
		return nil
	}})
	ts := host.served()
	t.Logf("per second: %s", perSecond(ts, start, total))
	host.members(t, start, total)
	checkBusiest(t, "whole run", ts, start, start, start.Add(total))
	late := between(ts, start.Add(slow+time.Second), start.Add(total))
	rate := float64(len(late)) / (total - slow - time.Second).Seconds()
	t.Logf("%.1f/s on the link near the timeout, after its first second", rate)
	if rate < 0.9*pace {
		t.Errorf("%.1f/s on the link near the timeout, want the pace of %d/s within 10%%", rate, pace)
	}
}
