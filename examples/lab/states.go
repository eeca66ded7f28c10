package main

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/retryhttp/retryhttp"
)

// The scenarios of the host model's states, one a row: a failing host (a
// broken replica behind a load balancer), a down host that comes back (an
// outage with a recovery, under open-loop traffic), and an overloaded one
// whose limit is on what it serves at once. Each retryhttp run uses the
// defaults, and watches what the Transport holds of the host.

// Seen is what a retryhttp Transport held of a host over a run, asked after
// every request: the states it went through, in order, whether it ever
// paced the host, and the limits in flight it held it to.
type Seen struct {
	States []retryhttp.HostState
	Paced  bool  // a learned pace (a rate) was in force at some point
	Limits []int // the limits in flight in force, in order, each change once
}

// watcher asks a Transport what it holds of one host, and keeps it in a
// Seen. Asking takes no time on the lab's clock, and for a host that
// announces no quota it changes nothing of how the host is held: the
// figures are the same unwatched (TestWatchingChangesNothing).
type watcher struct {
	tr     *retryhttp.Transport
	host   string
	mu     sync.Mutex
	seen   Seen
	unsent int // requests handed back unsent, with ErrHostDown
}

func newWatcher(c *http.Client, host string) *watcher {
	return &watcher{tr: c.Transport.(*retryhttp.Transport), host: host}
}

// look asks the Transport what it holds of the host now, and keeps what
// changed.
func (w *watcher) look() {
	st, err := w.tr.HostStatus(context.Background(), w.host)
	if err != nil {
		panic(err) // the in-process limiter does not fail
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := &w.seen
	if n := len(s.States); n == 0 || s.States[n-1] != st.State {
		s.States = append(s.States, st.State)
	}
	s.Paced = s.Paced || !st.Pace.Unlimited()
	if n := len(s.Limits); st.InFlight > 0 && (n == 0 || s.Limits[n-1] != st.InFlight) {
		s.Limits = append(s.Limits, st.InFlight)
	}
}

// fetch sends one GET through the Transport and reports whether it was
// served. A request handed back because the host is down is counted, not a
// bug in the lab: a host the model took for down when it was not is what
// the row would then show.
func (w *watcher) fetch(c *http.Client, url string) bool {
	status, _, err := get(c, url)
	switch {
	case errors.Is(err, retryhttp.ErrHostDown):
		w.mu.Lock()
		w.unsent++
		w.mu.Unlock()
		return false
	case err != nil:
		panic(err)
	}
	return status == http.StatusOK
}

// watchedWorkers runs n workers that fetch the items from a shared queue,
// one GET an item through one shared retryhttp Transport made with opts,
// and, when watched, asks it what it holds of the host after every item.
func (w *world) watchedWorkers(h *Host, n, items int, url func(int) string, watched bool, opts []retryhttp.Option) Outcome {
	client := w.retryClient(opts...)
	watch := newWatcher(client, h.Name)
	out := w.workers(n, items, func(item int) bool {
		if watched {
			defer watch.look()
		}
		return watch.fetch(client, url(item))
	})
	out.Seen, out.Unsent = watch.seen, watch.unsent
	return out
}

// ---- a broken replica: one request in five answered 503 at once ----

const (
	replicaHost    = "api.replicas.test"
	replicaEvery   = 5 // one request in five goes to the broken replica
	replicaWorkers = 30
	replicaPages   = 600
	// refusalLatency is what a 503 given at once takes, there and back:
	// a balancer's or a replica's answer before any work.
	refusalLatency = 5 * time.Millisecond
)

func replicaURL(page int) string {
	return "http://" + replicaHost + "/items?page=" + strconv.Itoa(page)
}

func (w *world) addReplicas() *Host {
	h := w.net.Add(replicaHost, shopLatency, &Replicas{clock: w.clock, Every: replicaEvery})
	h.Refusal = refusalLatency
	return h
}

// ReplicasNaive runs 30 workers that take the 600 pages from a shared
// queue and try each 3 times, asking again at once after a 503: what
// failsafe-go's failsafehttp retry policy does by default (2 retries, no
// delay without a Retry-After).
func ReplicasNaive() Outcome {
	w := newWorld()
	host := w.addReplicas()
	client := w.naiveClient()
	out := w.workers(replicaWorkers, replicaPages, func(page int) bool {
		for range 3 {
			if status, _ := mustGet(client, replicaURL(page)); status == http.StatusOK {
				return true
			}
		}
		return false
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// ReplicasRetryhttp runs the same 30 workers, one GET a page through one
// shared retryhttp Transport, and watches what it holds of the host.
func ReplicasRetryhttp(opts ...retryhttp.Option) Outcome { return replicasRun(true, opts...) }

func replicasRun(watched bool, opts ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.addReplicas()
	out := w.watchedWorkers(host, replicaWorkers, replicaPages, replicaURL, watched, opts)
	return out.from(host, http.StatusServiceUnavailable)
}

// ---- an outage with a recovery, under open-loop traffic ----

const (
	restartHost  = "orders.shop.test"
	restartEvery = 10 * time.Millisecond // a request every 10 ms: 100 a second
	restartDown  = 5 * time.Second       // the host answers 503 to everything from here
	restartUp    = 15 * time.Second      // to here: a 10 s outage
	restartEnd   = 25 * time.Second      // the last request arrives before this
)

func restartURL(order int) string {
	return "http://" + restartHost + "/orders?order=" + strconv.Itoa(order)
}

func (w *world) addRestarted() *Host {
	return w.net.Add(restartHost, shopLatency, &Restarted{clock: w.clock, Down: restartDown, Up: restartUp})
}

// Recovery is what an outage with a recovery cost and what came of it.
type Recovery struct {
	During  int           // requests that reached the host during the outage
	Unsent  int           // requests handed back unsent (ErrHostDown)
	AtOnce  int           // of which were handed back at once, without a wait
	GaveUp  int           // requests that got their last 503 back
	Served  int           // requests served
	Next    int           // requests served in the second after the return
	Busiest int           // the most requests the host got in one second after the return
	BusyAt  time.Duration // the start of that second
	// Longest is the longest a caller waited for its answer, and
	// LongestUnsent the longest for one handed back unsent.
	Longest, LongestUnsent time.Duration
	Arrivals               []time.Duration
}

// took counts how long one caller waited, and whether it was handed back
// unsent; the caller holds the lock.
func (r *Recovery) took(d time.Duration, unsent bool) {
	r.Longest = max(r.Longest, d)
	if unsent {
		r.Unsent++
		r.LongestUnsent = max(r.LongestUnsent, d)
		if d == 0 {
			r.AtOnce++
		}
	}
}

// openLoop starts a request every restartEvery until restartEnd, each a
// participant of its own that runs do, whatever became of the ones before:
// callers that do not wait for each other, as a service's users do not.
func (w *world) openLoop(do func(order int)) {
	w.clock.Run(func() {
		for order := 1; time.Duration(order-1)*restartEvery < restartEnd; order++ {
			w.clock.Go(func() { do(order) })
			w.sleep(restartEvery)
		}
	})
}

// RestartNaive sends each request up to 3 times, a second apart, as row 6's
// loop does.
func RestartNaive() Recovery {
	w := newWorld()
	host := w.addRestarted()
	client := w.naiveClient()
	var r Recovery
	var mu sync.Mutex
	w.openLoop(func(order int) {
		start := w.clock.Since()
		served := false
		for try := 1; try <= 3 && !served; try++ {
			if try > 1 {
				w.sleep(time.Second)
			}
			status, _ := mustGet(client, restartURL(order))
			served = status == http.StatusOK
		}
		mu.Lock()
		defer mu.Unlock()
		r.took(w.clock.Since()-start, false)
		if !served {
			r.GaveUp++
		}
	})
	return r.from(host)
}

// RestartRetryhttp sends each request once through one shared retryhttp
// Transport, and counts those handed back at once because the host is
// down.
func RestartRetryhttp(opts ...retryhttp.Option) Recovery {
	w := newWorld()
	host := w.addRestarted()
	client := w.retryClient(opts...)
	var r Recovery
	var mu sync.Mutex
	w.openLoop(func(order int) {
		start := w.clock.Since()
		status, _, err := get(client, restartURL(order))
		mu.Lock()
		defer mu.Unlock()
		down := errors.Is(err, retryhttp.ErrHostDown)
		r.took(w.clock.Since()-start, down)
		switch {
		case down:
		case err != nil:
			panic(err)
		case status != http.StatusOK:
			r.GaveUp++
		}
	})
	return r.from(host)
}

// from fills in what the host's log says.
func (r Recovery) from(h *Host) Recovery {
	r.During = h.Log.Between(restartDown, restartUp, 0)
	r.Served = h.Log.Count(http.StatusOK)
	r.Next = h.Log.Between(restartUp, restartUp+time.Second, http.StatusOK)
	r.Busiest, r.BusyAt = h.Log.BusiestSecond(restartUp)
	r.Arrivals = h.Log.Arrivals()
	return r
}

// ---- a host that serves 10 at a time, 100 ms each ----

const (
	slotsHost    = "api.slots.test"
	slotsSize    = 10 // requests served at once
	slotsWork    = 100 * time.Millisecond
	slotsWorkers = 30
	slotsPages   = 600 // at 100 a second, 6 s at best
)

func slotsURL(page int) string {
	return "http://" + slotsHost + "/items?page=" + strconv.Itoa(page)
}

func (w *world) addSlots() *Host {
	h := w.net.Add(slotsHost, slotsWork, &Slots{clock: w.clock, Size: slotsSize, Work: slotsWork})
	h.Refusal = refusalLatency
	return h
}

// SlotsNaive runs 30 workers that take the 600 pages from a shared queue
// and ask for each until they get it, a second after each 503.
func SlotsNaive() Outcome {
	w := newWorld()
	host := w.addSlots()
	client := w.naiveClient()
	out := w.workers(slotsWorkers, slotsPages, func(page int) bool {
		for {
			if status, _ := mustGet(client, slotsURL(page)); status == http.StatusOK {
				return true
			}
			w.sleep(time.Second)
		}
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// SlotsAtOnce is the naive loop that asks again at once after a 503, for
// the row's note.
func SlotsAtOnce() Outcome {
	w := newWorld()
	host := w.addSlots()
	client := w.naiveClient()
	out := w.workers(slotsWorkers, slotsPages, func(page int) bool {
		for {
			if status, _ := mustGet(client, slotsURL(page)); status == http.StatusOK {
				return true
			}
		}
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// SlotsRetryhttp runs the same 30 workers, one GET a page through one
// shared retryhttp Transport, and watches what it holds of the host.
func SlotsRetryhttp(opts ...retryhttp.Option) Outcome { return slotsRun(true, opts...) }

func slotsRun(watched bool, opts ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.addSlots()
	out := w.watchedWorkers(host, slotsWorkers, slotsPages, slotsURL, watched, opts)
	return out.from(host, http.StatusServiceUnavailable)
}
