package redislimit_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/redislimit"
	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

// A real Redis Cluster of three masters with a replica each, started by
// the test, reached through go-redis's ClusterClient with its default
// options, as several processes would.

// clusterNode is a node of the cluster as CLUSTER NODES lists it.
type clusterNode struct {
	id, addr, master string // master: the id of a replica's master
	isMaster         bool
}

func clusterNodes(t *testing.T, via *redistest.Server) []clusterNode {
	t.Helper()
	out, err := via.Cli("CLUSTER", "NODES")
	if err != nil {
		t.Fatalf("CLUSTER NODES: %v: %s", err, out)
	}
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		nodes = append(nodes, clusterNode{id: f[0], addr: addr, master: f[3],
			isMaster: strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail")})
	}
	return nodes
}

// replicaOf returns the server replicating the master at addr.
func replicaOf(t *testing.T, servers []*redistest.Server, addr string) *redistest.Server {
	t.Helper()
	nodes := clusterNodes(t, servers[0])
	var id string
	for _, n := range nodes {
		if n.addr == addr {
			id = n.id
		}
	}
	for _, n := range nodes {
		if n.master == id {
			for _, s := range servers {
				if s.Addr == n.addr {
					return s
				}
			}
		}
	}
	t.Fatalf("no replica of %s", addr)
	return nil
}

func serverAt(servers []*redistest.Server, addr string) *redistest.Server {
	for _, s := range servers {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

func newClusterClient(t *testing.T, servers []*redistest.Server, hooks ...redis.Hook) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{servers[0].Addr, servers[1].Addr}})
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// masterFor is the address of the master holding key, as a fresh client
// sees the cluster.
func masterFor(t *testing.T, c *redis.ClusterClient, key string) string {
	t.Helper()
	m, err := c.MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return m.Options().Addr
}

// slotHook records, for each script call, the hash slots of its keys.
type slotHook struct {
	mu    sync.Mutex
	calls int
	keys  map[string]bool
	mixed []string // calls whose keys were not all of one slot
}

func (h *slotHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slotHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slotHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if name := strings.ToLower(cmd.Name()); (name == "evalsha" || name == "eval") && len(args) >= 3 {
			n, _ := args[2].(int)
			var keys []string
			for i := 3; i < 3+n && i < len(args); i++ {
				keys = append(keys, fmt.Sprint(args[i]))
			}
			h.mu.Lock()
			h.calls++
			if h.keys == nil {
				h.keys = make(map[string]bool)
			}
			slots := map[int]bool{}
			for _, k := range keys {
				h.keys[k] = true
				slots[redislimit.KeySlot(k)] = true
			}
			if len(slots) != 1 {
				h.mixed = append(h.mixed, strings.Join(keys, ","))
			}
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// clusterHosts returns stub hosts whose keys lie on distinct masters,
// the first two on the master first, then one on each other master.
func clusterHosts(t *testing.T, servers []*redistest.Server, prefix string) (hosts []*fleetHost, masters []string) {
	t.Helper()
	c := newClusterClient(t, servers) // a fresh slot map
	seen := map[string]int{}
	var first string
	for range 60 {
		h := newFleetHost(t)
		m := masterFor(t, c, prefix+hostOf(h.URL))
		switch {
		case first == "":
			first = m
		case m == first && seen[m] < 2:
		case seen[m] == 0:
		default:
			h.Close()
			continue
		}
		seen[m]++
		hosts, masters = append(hosts, h), append(masters, m)
		if len(seen) == 3 && seen[first] == 2 {
			break
		}
	}
	if len(hosts) != 4 {
		t.Fatalf("found hosts on %d masters, want 3", len(seen))
	}
	// Order: two on the first master, then the others.
	for i := 1; i < len(hosts); i++ {
		if masters[i] == first && i != 1 {
			hosts[1], hosts[i] = hosts[i], hosts[1]
			masters[1], masters[i] = masters[i], masters[1]
		}
	}
	return hosts, masters
}

// clusterRun hammers each host from 3 limiters (processes) for total, 4
// goroutines each per host, at the shared 20/s, while events happen;
// it samples each limiter's view of each host every 10 ms.
type clusterRun struct {
	ls     []*redislimit.Limiter
	mu     sync.Mutex
	inProc map[[2]int][]time.Duration // (limiter, host): moments it was seen paced in process
}

func newClusterRun(t *testing.T, servers []*redistest.Server, prefix string) *clusterRun {
	run := &clusterRun{inProc: map[[2]int][]time.Duration{}}
	for range 3 {
		c := newClusterClient(t, servers)
		l := redislimit.New(c, redislimit.WithPrefix(prefix), redislimit.WithTimeout(fleetTimeout))
		t.Cleanup(func() { l.Close() })
		// A client's first calls load the slot map and dial each master:
		// under -race on a loaded machine they took past the 250 ms
		// timeout, and hosts were paced in process from the start, before
		// any failover (TestCluster/PlannedFailover, 260 ms in). Check
		// loads the map and one master's scripts, a PING opens a
		// connection to each master.
		warm(t, l)
		if err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		}); err != nil {
			t.Logf("not every master answered a PING: %v", err)
		}
		run.ls = append(run.ls, l)
	}
	return run
}

func (run *clusterRun) run(t *testing.T, hosts []*fleetHost, busy int, total time.Duration, events ...event) time.Time {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(total))
	defer cancel()
	var wg sync.WaitGroup
	for i, l := range run.ls {
		client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
		for _, h := range hosts[:busy] {
			var longest atomic.Int64
			wg.Go(func() { fleetHammer(ctx, client, h.URL+"/"+fmt.Sprint(i), 4, &longest) })
		}
	}
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			at := time.Since(start)
			for i, l := range run.ls {
				for j, h := range hosts {
					if l.PacedInProcess(hostOf(h.URL)) {
						run.mu.Lock()
						run.inProc[[2]int{i, j}] = append(run.inProc[[2]int{i, j}], at)
						run.mu.Unlock()
					}
				}
			}
		}
	})
	playEvents(t, ctx, start, events)
	wg.Wait()
	return start
}

// pacedInProcess returns the first and last moments any limiter was seen
// pacing host j in process, and whether it ever was.
func (r *clusterRun) pacedInProcess(j int) (first, last time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.ls {
		for _, at := range r.inProc[[2]int{i, j}] {
			if !ok || at < first {
				first = at
			}
			if !ok || at > last {
				last = at
			}
			ok = true
		}
	}
	return first, last, ok
}

func TestCluster(t *testing.T) {
	// cluster-require-full-coverage no: while a dead master's slots wait
	// for their replica, the other masters keep answering for theirs (see
	// the README).
	servers := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")

	t.Run("SharedPaceOneSlot", func(t *testing.T) {
		prefix := testPrefix(t)
		hosts, masters := clusterHosts(t, servers, prefix)
		hook := &slotHook{}
		ls := make([]*redislimit.Limiter, 3)
		for i := range ls {
			ls[i] = redislimit.New(newClusterClient(t, servers, hook), redislimit.WithPrefix(prefix), redislimit.WithTimeout(testTimeout))
			t.Cleanup(func() { ls[i].Close() })
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for i, l := range ls {
			client := retryhttp.NewClient(retryhttp.WithLimiter(l), retryhttp.WithPace(pace, 1))
			for _, h := range hosts[1:] {
				var longest atomic.Int64
				wg.Go(func() { fleetHammer(ctx, client, h.URL+"/"+fmt.Sprint(i), 4, &longest) })
			}
		}
		wg.Wait()
		for j, h := range hosts[1:] {
			t.Logf("host %d on master %s", j+1, masters[j+1])
			checkRate(t, h.served(), pace, 0.05)
		}
		// A parking one process sees holds for all.
		until := time.Now().Add(2 * time.Second)
		ph := hostOf(hosts[0].URL)
		if err := ls[0].Park(context.Background(), ph, until); err != nil {
			t.Fatal(err)
		}
		for _, l := range ls[1:] {
			res, err := l.Reserve(context.Background(), retryhttp.Attempt{Host: ph, Pace: retryhttp.Pace{Limit: pace, Burst: 1}, Now: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if d := res.ParkedUntil.Sub(until); res.ParkedUntil.IsZero() || d < -20*time.Millisecond || d > 20*time.Millisecond {
				t.Errorf("parking set by one process seen by another as %+v, want parked until %v", res, until)
			}
		}
		hook.mu.Lock()
		defer hook.mu.Unlock()
		t.Logf("%d script calls, keys %d", hook.calls, len(hook.keys))
		if len(hook.mixed) > 0 {
			t.Errorf("calls naming keys of several slots: %v", hook.mixed)
		}
		for k := range hook.keys {
			if out, err := servers[0].Cli("CLUSTER", "KEYSLOT", k); err != nil || strings.TrimSpace(out) != fmt.Sprint(redislimit.KeySlot(k)) {
				t.Errorf("slot of %q: Redis says %q (%v), the limiter %d", k, out, err, redislimit.KeySlot(k))
			}
			h, ok := strings.CutPrefix(k, prefix)
			if !ok || strings.ContainsAny(h, "\x00") {
				t.Errorf("key %q is not prefix + host", k)
			}
		}
		for _, l := range ls {
			if l.Fallback() {
				t.Errorf("a limiter fell back")
			}
		}
	})

	t.Run("PlannedFailover", func(t *testing.T) {
		// A run over a bound is run once more (runOnceMore), on hosts
		// of a prefix of its own (the failover runs again, from the
		// replica that is the master now): in a full -race run on a
		// loaded machine, every host held 22-23 in the second from 0.96 s,
		// before the failover, the requests of a stall of the process
		// going out together. A failover that cost something costs it
		// every run.
		runOnceMore(t, func(try int, last bool) bool {
			prefix := testPrefix(t) + strconv.Itoa(try)
			hosts, masters := clusterHosts(t, servers, prefix)
			replica := replicaOf(t, servers, masters[1])
			run := newClusterRun(t, servers, prefix)
			start := run.run(t, hosts, 4, 4*time.Second, event{at: 1500 * time.Millisecond, do: func() error {
				out, err := replica.Cli("CLUSTER", "FAILOVER")
				if err != nil || !strings.Contains(out, "OK") {
					return fmt.Errorf("CLUSTER FAILOVER: %v %s", err, out)
				}
				return nil
			}})
			if m := masterFor(t, newClusterClient(t, servers), prefix+hostOf(hosts[1].URL)); m != replica.Addr {
				t.Fatalf("host 1's master is %s after the failover, want the replica %s", m, replica.Addr)
			}
			if !last {
				for j, h := range hosts {
					_, _, inProc := run.pacedInProcess(j)
					if inProc || overBusiest(h.served(), start, start, start.Add(4*time.Second)) {
						return true
					}
				}
			}
			for j, h := range hosts {
				ts := h.served()
				checkBusiest(t, fmt.Sprintf("host %d", j), ts, start, start, start.Add(4*time.Second))
				checkRate(t, between(ts, start.Add(time.Second), start.Add(4*time.Second)), pace, 0.1)
				if first, last, ok := run.pacedInProcess(j); ok {
					t.Errorf("host %d paced in process from %v to %v through a planned failover", j, first, last)
				}
			}
			return false
		})
	})

	// Last: a master killed, its replica promoted. Host 0 and host 1 are
	// on it; host 0 is parked by one process while the master is dead.
	t.Run("MasterKilled", func(t *testing.T) {
		prefix := testPrefix(t)
		hosts, masters := clusterHosts(t, servers, prefix)
		dead := serverAt(servers, masters[1])
		replica := replicaOf(t, servers, masters[1])
		waitFor(t, "the replica in sync", 10*time.Second, func() bool {
			out, err := replica.Cli("INFO", "replication")
			return err == nil && strings.Contains(out, "master_link_status:up")
		})
		watch := redis.NewClient(&redis.Options{Addr: replica.Addr})
		t.Cleanup(func() { watch.Close() })
		var (
			promoted time.Time
			killed   time.Time
			parked   time.Time
			mu       sync.Mutex
		)
		run := newClusterRun(t, servers, prefix)
		parkHost := hostOf(hosts[0].URL)
		start := run.run(t, hosts, 4, 8*time.Second,
			event{at: 1500 * time.Millisecond, do: func() error {
				mu.Lock()
				killed = time.Now()
				mu.Unlock()
				dead.Crash()
				go func() {
					for time.Since(killed) < 10*time.Second {
						if r, err := watch.Do(context.Background(), "ROLE").Slice(); err == nil && len(r) > 0 && fmt.Sprint(r[0]) == "master" {
							mu.Lock()
							promoted = time.Now()
							mu.Unlock()
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
				}()
				return nil
			}},
			event{at: 1800 * time.Millisecond, do: func() error {
				// As a 503 naming a wait would, while the master is dead.
				parked = time.Now().Add(30 * time.Second)
				return run.ls[0].Park(context.Background(), parkHost, parked)
			}})
		mu.Lock()
		defer mu.Unlock()
		if promoted.IsZero() {
			out, _ := replica.Cli("CLUSTER", "NODES")
			t.Log(out)
			t.Fatal("the replica was not promoted")
		}
		t.Logf("replica promoted %v after the kill (at %v)", promoted.Sub(killed).Round(time.Millisecond), promoted.Sub(start).Round(time.Millisecond))
		for j, h := range hosts {
			first, last, ok := run.pacedInProcess(j)
			switch {
			case j <= 1 && ok:
				back := start.Add(last).Sub(promoted)
				t.Logf("host %d paced in process from %v to %v: back on Redis %v after the promotion", j, first, last, back.Round(time.Millisecond))
				if j == 1 && back > 2*time.Second {
					t.Errorf("host %d back on Redis %v after the promotion, want within 2s", j, back)
				}
			case j > 1 && ok:
				t.Errorf("host %d, on a healthy master, paced in process from %v to %v", j, first, last)
			}
			if j == 0 {
				continue
			}
			ts := h.served()
			checkBusiest(t, fmt.Sprintf("host %d", j), ts, start, start, start.Add(8*time.Second))
			t.Logf("host %d per second: %s", j, perSecond(ts, start, 8*time.Second))
		}
		// The parking learnt while the master was dead is on the new
		// master: a process started now sees it.
		after := between(hosts[0].served(), parked.Add(-30*time.Second), start.Add(8*time.Second))
		late := between(after, promoted.Add(2*time.Second), start.Add(8*time.Second))
		t.Logf("host 0: %d requests after its parking (by the processes that could not hear of it), %d more than 2s after the promotion", len(after), len(late))
		if len(late) > 0 {
			t.Errorf("host 0 served %d requests more than 2s after the promotion, parked by a process meanwhile", len(late))
		}
		fresh := redislimit.New(newClusterClient(t, servers), redislimit.WithPrefix(prefix), redislimit.WithTimeout(testTimeout))
		defer fresh.Close()
		res, err := fresh.Reserve(context.Background(), retryhttp.Attempt{Host: parkHost, Pace: retryhttp.Pace{Limit: pace, Burst: 1}, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		// Within 200 ms of the parking set: the processes that met the
		// 503 park the host each from its own answer, up to a few tens of
		// milliseconds apart on the real clock (50.3 ms once, under -race
		// in a clean-clone CI run), and the latest stands.
		if d := res.ParkedUntil.Sub(parked); res.ParkedUntil.IsZero() || d < -200*time.Millisecond || d > 200*time.Millisecond {
			t.Errorf("a new process sees host 0 as %+v, want parked until %v", res, parked)
		}
	})
}
