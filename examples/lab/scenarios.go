package main

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/retryhttp/retryhttp"
)

// Every scenario builds a fresh clock, network and hosts, runs its
// collectors as participants of the clock, and reports what the host saw.
// The naive loops use a plain http.Client over the same network; the
// retryhttp runs put retryhttp.Transport in front of it with WithBase, and
// share the clock with WithClock.

// Outcome is what one run of a scenario cost and achieved.
type Outcome struct {
	Requests int           // requests the host answered
	Refused  int           // of which were refused (429, 503 or 403)
	Served   int           // pages or collectors that got their 200
	Done     time.Duration // virtual time when the last collector finished
	Burst    int           // the most requests that arrived at one instant after the start
	// Second is what a second request to the host got right after the
	// first gave up, in the Retry-After: 86400 scenario.
	Second error
	// Caught is, in the scenario whose host's capacity rises mid-run, the
	// start of the first whole second after the rise in which the host
	// served at least risingServed requests: how soon the pace follows the
	// capacity up. -1 if no second did.
	Caught time.Duration
	// Arrivals is when each request reached the host, since the start.
	Arrivals []time.Duration
	// Unsent counts the requests handed back at once, without being sent,
	// because their host was down.
	Unsent int
	// Seen is what the retryhttp Transport held of the host, in the rows
	// that watch it.
	Seen Seen
}

// world is one scenario's clock and network.
type world struct {
	clock *Clock
	net   *Network
}

func newWorld() *world {
	c := NewClock()
	return &world{clock: c, net: NewNetwork(c)}
}

// naiveClient is what a hand-written loop uses: net/http, nothing else.
func (w *world) naiveClient() *http.Client { return &http.Client{Transport: w.net} }

// retryClient is an http.Client whose Transport is retryhttp's, over the
// lab's network and clock, with seeded jitter; opts come after those.
func (w *world) retryClient(opts ...retryhttp.Option) *http.Client {
	all := append([]retryhttp.Option{
		retryhttp.WithBase(w.net),
		retryhttp.WithClock(w.clock),
		retryhttp.WithRand(seededRand(2)),
	}, opts...)
	return retryhttp.NewClient(all...)
}

// seededRand is a source of jitter that draws the same numbers on every
// run. The lab's clock runs one collector at a time, in a fixed order, so
// the draws also go to the same retries every time.
func seededRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

// get sends a GET and returns the status and headers, the body read and
// closed; a transport error is returned as it is.
func get(client *http.Client, url string) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header, nil
}

// mustGet is get for the lab's network, where a transport error is a bug
// in the lab.
func mustGet(client *http.Client, url string) (int, http.Header) {
	status, h, err := get(client, url)
	if err != nil {
		panic(err)
	}
	return status, h
}

// sleep is a naive loop's time.Sleep, on the lab's clock.
func (w *world) sleep(d time.Duration) { w.clock.Sleep(context.Background(), d) }

// trustRetryAfter is seed 000's naive loop: ask, and after a refusal sleep
// whatever Retry-After says, for at most tries tries (0: until served). It
// returns 1 if the request was served, else 0.
func (w *world) trustRetryAfter(client *http.Client, url string, tries int) int {
	for n := 1; tries == 0 || n <= tries; n++ {
		status, h := mustGet(client, url)
		if status == http.StatusOK {
			return 1
		}
		secs, _ := strconv.Atoi(h.Get("Retry-After"))
		w.sleep(time.Duration(secs) * time.Second)
	}
	return 0
}

// ---- 20 pages from a token bucket of 5, then 1 a second (seed 002) ----

const priceHost = "bazaar.nimbu.test"

func pageURL(page int) string {
	return "http://" + priceHost + "/api/v1/prices?page=" + strconv.Itoa(page)
}

// PagesNaive fetches the 20 pages one after another, each until it arrives:
// asking again at once after a refusal, or sleeping what Retry-After says.
func PagesNaive(obeyRetryAfter bool) Outcome {
	w := newWorld()
	host := w.net.Add(priceHost, shopLatency, NewPriceAPI(w.clock))
	client := w.naiveClient()
	var out Outcome
	w.clock.Run(func() {
		for page := 1; page <= 20; page++ {
			for {
				status, h := mustGet(client, pageURL(page))
				if status == http.StatusOK {
					out.Served++
					break
				}
				if obeyRetryAfter {
					secs, _ := strconv.Atoi(h.Get("Retry-After"))
					w.sleep(time.Duration(secs) * time.Second)
				}
			}
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusTooManyRequests)
}

// PagesRetryhttp fetches the 20 pages through retryhttp, one request each:
// the Transport obeys the 429's Retry-After by itself. With paced, it also
// keeps to a bucket of its own, 3 at once then 0.9 a second, below the
// host's limit.
func PagesRetryhttp(paced bool) Outcome {
	w := newWorld()
	host := w.net.Add(priceHost, shopLatency, NewPriceAPI(w.clock))
	opts := pagesOptions
	if paced {
		opts = pagesPacedOptions
	}
	client := w.retryClient(opts...)
	var out Outcome
	w.clock.Run(func() {
		for page := 1; page <= 20; page++ {
			if status, _ := mustGet(client, pageURL(page)); status == http.StatusOK {
				out.Served++
			}
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusTooManyRequests)
}

// Enough tries that every page arrives, and no budget: these runs are about
// pacing and Retry-After, not about capping retries.
var (
	pagesOptions      = []retryhttp.Option{retryhttp.WithMaxAttempts(50), retryhttp.WithBudget(nil)}
	pagesPacedOptions = append([]retryhttp.Option{retryhttp.WithPace(0.9, 3)}, pagesOptions...)
)

// ---- a board closed for 90 s, its clock 40 s behind (seed 002) ----

const flakyHost = "flaky.nimbu.test"

func (w *world) addBoard() *Host {
	return w.net.Add(flakyHost, shopLatency, &Board{clock: w.clock, Closed: 90 * time.Second, Skew: -40 * time.Second})
}

// BoardNaive waits for the board counting the Retry-After date from its own
// clock, never less than a second.
func BoardNaive() Outcome {
	w := newWorld()
	host := w.addBoard()
	client := w.naiveClient()
	var out Outcome
	w.clock.Run(func() {
		for {
			status, h := mustGet(client, "http://"+flakyHost+"/board")
			if status == http.StatusOK {
				out.Served++
				break
			}
			when, err := http.ParseTime(h.Get("Retry-After"))
			if err != nil {
				panic(err)
			}
			w.sleep(max(time.Second, when.Sub(w.clock.Now())))
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// BoardRetryhttp waits for the board through retryhttp, which counts the
// date from the answer's Date header. The wait is 90 s, beyond the default
// max of 60 s, so the lab passes boardOptions, which raise the max to 2
// minutes: with the default, retryhttp returns the 503 at once and parks
// the host instead.
func BoardRetryhttp(opts ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.addBoard()
	client := w.retryClient(opts...)
	var out Outcome
	w.clock.Run(func() {
		if status, _ := mustGet(client, "http://"+flakyHost+"/board"); status == http.StatusOK {
			out.Served++
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusServiceUnavailable)
}

var boardOptions = []retryhttp.Option{retryhttp.WithRetryAfterLimits(time.Second, 2*time.Minute)}

// ---- 50 collectors against a host that serves 5 a second (seed 002) ----

const collectors = 50

func (w *world) addStock() *Host {
	return w.net.Add(flakyHost, shopLatency, &Stock{clock: w.clock, PerSecond: 5})
}

func stockURL(item int) string {
	return "http://" + flakyHost + "/stock?item=" + strconv.Itoa(item)
}

// Fixed waits a second after every failure.
func Fixed(failures int) time.Duration { return time.Second }

// Exponential waits 2, 4, 8, 16, 30, 30 ... seconds: no jitter.
func Exponential(failures int) time.Duration {
	return min(30*time.Second, 2*time.Second<<min(failures-1, 5))
}

// CollectorsNaive runs 50 collectors that each retry until they get their
// item, waiting wait(failures) after each 503.
func CollectorsNaive(wait func(failures int) time.Duration) Outcome {
	w := newWorld()
	host := w.addStock()
	client := w.naiveClient()
	var out Outcome
	var mu sync.Mutex
	for item := range collectors {
		w.clock.Go(func() {
			for failures := 0; ; {
				status, _ := mustGet(client, stockURL(item))
				if status == http.StatusOK {
					mu.Lock()
					out.Served++
					out.Done = max(out.Done, w.clock.Since())
					mu.Unlock()
					return
				}
				failures++
				w.sleep(wait(failures))
			}
		})
	}
	w.clock.Run()
	return out.from(host, http.StatusServiceUnavailable)
}

// CollectorsRetryhttp runs 50 collectors that each send one request through
// one shared retryhttp Transport, which retries the 503s with full-jitter
// backoff.
func CollectorsRetryhttp(opts ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.addStock()
	client := w.retryClient(opts...)
	var out Outcome
	var mu sync.Mutex
	for item := range collectors {
		w.clock.Go(func() {
			status, _ := mustGet(client, stockURL(item))
			mu.Lock()
			defer mu.Unlock()
			if status == http.StatusOK {
				out.Served++
				out.Done = max(out.Done, w.clock.Since())
			}
		})
	}
	w.clock.Run()
	return out.from(host, http.StatusServiceUnavailable)
}

// Enough tries that every collector is served, and no budget: 50 first
// tries at 10 % would allow only a handful of retries, and this run is
// about the shape of the backoff.
var (
	collectorsOptions     = []retryhttp.Option{retryhttp.WithMaxAttempts(20), retryhttp.WithBudget(nil)}
	collectorsSeedOptions = append([]retryhttp.Option{retryhttp.WithBackoff(2*time.Second, 30*time.Second)}, collectorsOptions...)
)

// ---- an outage: 100 pages, 3 tries each (seed 002) ----

const pages = 100

func catalogueURL(page int) string {
	return "http://" + flakyHost + "/catalogue?page=" + strconv.Itoa(page)
}

// OutageNaive fetches 100 pages from a host that is down, 3 tries a page, a
// second apart.
func OutageNaive() Outcome {
	w := newWorld()
	host := w.net.Add(flakyHost, shopLatency, &Outage{clock: w.clock})
	client := w.naiveClient()
	var out Outcome
	w.clock.Run(func() {
		for page := 1; page <= pages; page++ {
			for try := 1; try <= 3; try++ {
				if status, _ := mustGet(client, catalogueURL(page)); status == http.StatusOK {
					out.Served++
					break
				}
				if try < 3 {
					w.sleep(time.Second)
				}
			}
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// OutageRetryhttp fetches the 100 pages through retryhttp with 3 tries a
// page (the default), the given budget (nil: none) and extra options.
// Once the host is down, a page is handed back at once with ErrHostDown,
// unsent.
func OutageRetryhttp(budget *retryhttp.Budget, extra ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.net.Add(flakyHost, shopLatency, &Outage{clock: w.clock})
	opts := append([]retryhttp.Option{retryhttp.WithMaxAttempts(3), retryhttp.WithBudget(budget)}, extra...)
	client := w.retryClient(opts...)
	var out Outcome
	w.clock.Run(func() {
		for page := 1; page <= pages; page++ {
			status, _, err := get(client, catalogueURL(page))
			switch {
			case errors.Is(err, retryhttp.ErrHostDown):
				out.Unsent++ // handed back at once: the host is down
			case err != nil:
				panic(err)
			case status == http.StatusOK:
				out.Served++
			}
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// ---- Retry-After: 0 on a 403, and Retry-After: 86400 (seed 000) ----

const stubHost = "127.0.0.1:8080"

// ForbiddenNaive is seed 000's naive_retry: it sleeps whatever Retry-After
// says, 5 tries.
func ForbiddenNaive() Outcome {
	w := newWorld()
	host := w.net.Add(stubHost, loopbackLatency, Forbidden{})
	client := w.naiveClient()
	var out Outcome
	w.clock.Run(func() {
		out.Served = w.trustRetryAfter(client, "http://"+stubHost+"/", 5)
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusForbidden)
}

// ForbiddenRetryhttp sends the same request through retryhttp told to retry
// 403 (it does not by default) with 5 tries: the 1 s floor applies.
func ForbiddenRetryhttp() Outcome {
	w := newWorld()
	host := w.net.Add(stubHost, loopbackLatency, Forbidden{})
	client := w.retryClient(forbiddenOptions...)
	var out Outcome
	w.clock.Run(func() {
		if status, _ := mustGet(client, "http://"+stubHost+"/"); status == http.StatusOK {
			out.Served++
		}
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusForbidden)
}

var forbiddenOptions = []retryhttp.Option{retryhttp.WithRetryStatuses(http.StatusForbidden), retryhttp.WithMaxAttempts(5)}

// blipLength is how long the 503s that say "Retry-After: 86400" last.
const blipLength = 5 * time.Second

// BlipNaive trusts Retry-After: 86400 and sleeps a day before asking again.
func BlipNaive() Outcome {
	w := newWorld()
	host := w.net.Add(stubHost, loopbackLatency, &Blip{clock: w.clock, For: blipLength})
	client := w.naiveClient()
	var out Outcome
	w.clock.Run(func() {
		out.Served = w.trustRetryAfter(client, "http://"+stubHost+"/", 0)
		out.Done = w.clock.Since()
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// BlipRetryhttp sends the request through retryhttp with its defaults: the
// wait is beyond the 60 s max, so it returns the 503 at once and parks the
// host; a second request right after fails fast with ErrHostPaused.
func BlipRetryhttp() Outcome {
	w := newWorld()
	host := w.net.Add(stubHost, loopbackLatency, &Blip{clock: w.clock, For: blipLength})
	client := w.retryClient()
	var out Outcome
	w.clock.Run(func() {
		if status, _ := mustGet(client, "http://"+stubHost+"/"); status == http.StatusOK {
			out.Served++
		}
		out.Done = w.clock.Since()
		_, _, out.Second = get(client, "http://"+stubHost+"/")
		if out.Second == nil {
			out.Second = errors.New("the second request was sent")
		}
	})
	return out.from(host, http.StatusServiceUnavailable)
}

// ---- a host that announces its quota: 10 per 1 s window ----

const (
	quotaHost    = "api.quota.test"
	quotaLimit   = 10 // requests a window
	quotaWorkers = 30
	quotaPages   = 150
)

func quotaURL(page int) string {
	return "http://" + quotaHost + "/items?page=" + strconv.Itoa(page)
}

func (w *world) addQuota() *Host {
	return w.net.Add(quotaHost, shopLatency, &Quota{clock: w.clock, Limit: quotaLimit})
}

// QuotaNaive runs 30 workers that take the 150 pages from a shared queue;
// each asks for its page until it gets it, sleeping the 429's Retry-After
// after each refusal: the usual hand-written loop.
func QuotaNaive() Outcome {
	w := newWorld()
	host := w.addQuota()
	client := w.naiveClient()
	out := w.workers(quotaWorkers, quotaPages, func(page int) bool {
		for {
			status, h := mustGet(client, quotaURL(page))
			if status == http.StatusOK {
				return true
			}
			secs, _ := strconv.Atoi(h.Get("Retry-After"))
			w.sleep(time.Duration(secs) * time.Second)
		}
	})
	return out.from(host, http.StatusTooManyRequests)
}

// QuotaRetryhttp runs the same 30 workers, each sending one GET a page
// through one shared retryhttp Transport.
func QuotaRetryhttp(opts ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.addQuota()
	client := w.retryClient(opts...)
	out := w.workers(quotaWorkers, quotaPages, func(page int) bool {
		status, _ := mustGet(client, quotaURL(page))
		return status == http.StatusOK
	})
	return out.from(host, http.StatusTooManyRequests)
}

// ---- a host whose capacity rises mid-run: 5/s, then 40/s ----

const (
	risingWorkers = 50
	risingItems   = 800
	risingAfter   = 10 * time.Second // when the capacity rises
	risingServed  = 30               // served in a second: the pace has followed
)

func (w *world) addRising() *Host {
	return w.net.Add(flakyHost, shopLatency, &Stock{clock: w.clock, PerSecond: 5, Then: 40, After: risingAfter})
}

// RisingNaive runs 50 workers that take the 800 items from a shared queue
// and ask for each until they get it, a second after each 503.
func RisingNaive() Outcome {
	w := newWorld()
	host := w.addRising()
	client := w.naiveClient()
	out := w.workers(risingWorkers, risingItems, func(item int) bool {
		for {
			if status, _ := mustGet(client, stockURL(item)); status == http.StatusOK {
				return true
			}
			w.sleep(time.Second)
		}
	})
	return out.rising(host)
}

// RisingRetryhttp runs the same 50 workers, each sending one GET an item
// through one shared retryhttp Transport.
func RisingRetryhttp(opts ...retryhttp.Option) Outcome {
	w := newWorld()
	host := w.addRising()
	client := w.retryClient(opts...)
	out := w.workers(risingWorkers, risingItems, func(item int) bool {
		status, _ := mustGet(client, stockURL(item))
		return status == http.StatusOK
	})
	return out.rising(host)
}

// risingOptions give every item enough tries, and turn the budget off, as
// for the collectors.
var risingOptions = collectorsOptions

func (o Outcome) rising(h *Host) Outcome {
	o = o.from(h, http.StatusServiceUnavailable)
	o.Caught = -1
	if at, ok := h.Log.FirstBusySecond(risingAfter, http.StatusOK, risingServed); ok {
		o.Caught = at
	}
	return o
}

// workers runs n workers as participants of the clock; each takes the next
// item of a shared queue of items (1 to items) and fetches it, until the
// queue is empty. fetch reports whether the item was served. The outcome
// counts the items served, and Done is when the last was.
func (w *world) workers(n, items int, fetch func(item int) bool) Outcome {
	var (
		mu   sync.Mutex
		next = 1
		out  Outcome
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next > items {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for range n {
		w.clock.Go(func() {
			for {
				item, ok := take()
				if !ok {
					return
				}
				if fetch(item) {
					mu.Lock()
					out.Served++
					out.Done = max(out.Done, w.clock.Since())
					mu.Unlock()
				}
			}
		})
	}
	w.clock.Run()
	return out
}

// from fills in what the host's log says.
func (o Outcome) from(h *Host, refusal int) Outcome {
	o.Requests = h.Log.Requests()
	o.Refused = h.Log.Count(refusal)
	o.Burst = h.Log.LargestBurst()
	o.Arrivals = h.Log.Arrivals()
	return o
}
