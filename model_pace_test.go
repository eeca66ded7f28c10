package retryhttp

import (
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// A pace of one a hold or slower makes each waiter wait about an interval
// (told to ask again a horizon before its slot), so the latest wait was
// often a hold old when the pace was checked: it was never seen to bind,
// never grown, and held until the record was forgotten. A bucket of 3 a
// second cut to 1 a second by its first burst served 79 pages in 70 s
// (bucket429:44 of the simulator), and an outage of bare 503s taken for
// overload left its host at 1 a second with calls of a minute
// (outage503:76). Seen to bind, it grows: within 2x, where it took 2.7x
// (the property's 1.3x is still missed by how slowly a pace cut by a
// burst grows back).
func TestSlowPaceSeenToBind(t *testing.T) {
	h := &simBucketCfg{rate1: 3, burst: 1, code: 429, lat: 27 * time.Millisecond}
	const pages = 79
	d := simDraw{
		mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
		pages: pages, workers: 2, ideal: simIdealPaced(float64(pages-1)/3, pages, 2, h.lat),
		slow: 2, need: pages, minGot: pages,
	}
	for seed := range uint64(5) {
		r := runSim(t, d, seed, false)
		if miss := simCheck(d, r); len(miss) > 0 {
			t.Errorf("seed %d: %s", seed, strings.Join(miss, "; "))
		}
	}
}

// A lone refusal at a pace the host took before is noise, but not one that
// names a wait: it parks the host for that wait, so the next refusal comes
// a wait later and looks lone too, however often the host refuses. A bucket
// announcing its rate, fallen from 14/s to 8/s under a pace of 11.8/s,
// refused one request a second, each parking the host a second, for four
// minutes: 29 pages lost and 6.6x the ideal (capacityChange:7 of the
// simulator). Such a refusal is cut for.
func TestParkingRefusalIsNotNoise(t *testing.T) {
	h := &simBucketCfg{rate1: 14, rate2: 8, change: 23600 * time.Millisecond, burst: 1, code: 429, headers: simIETF, lat: 36 * time.Millisecond}
	const pages = 461
	d := simDraw{
		mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
		pages: pages, workers: 6, ideal: 39813 * time.Millisecond,
		slow: 2, need: pages, minGot: pages,
	}
	for seed := range uint64(3) {
		r := runSim(t, d, seed, false)
		if miss := simCheck(d, r); len(miss) > 0 {
			t.Errorf("seed %d: %s", seed, strings.Join(miss, "; "))
		}
	}
}

// A bucket's refusals are its load, never chance. A bucket of 14/s with a
// burst of 28 saves tokens under a pace just below its rate, so a probe
// past the rate runs unrefused for holds and climbs to three times it; the
// cuts that its refusals then bring read what the bucket accepted from its
// savings, and leave the pace above the rate. Two things took those
// refusals for chance, and the pace was never cut again: the check of the
// probe's own cut (its load caused them: it is not checked), and the check
// of the next cut, which lowered the share refused by less than two
// standard errors of too few answers (a share that fell by more than one
// is undecided now, and awaits more answers).
func TestBucketRefusalsNotChance(t *testing.T) {
	h := &simBucketCfg{rate1: 14, burst: 28, code: 503, lat: 30 * time.Millisecond}
	const pages = 28 + 15*14
	d := simDraw{
		mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
		pages: pages, workers: 5, ideal: simIdealPaced(float64(pages-28)/14, pages, 5, h.lat),
		slow: 1.3, need: pages, minGot: pages,
	}
	for seed := range uint64(6) {
		r := runSim(t, d, seed, true)
		for _, l := range r.trace {
			if strings.Contains(l, "refusals by chance") {
				t.Errorf("seed %d: a bucket's refusals taken for chance: %s", seed, l)
			}
		}
		if lim := simRequestsSlack * d.need; float64(r.sent) > lim {
			t.Errorf("seed %d: %d requests for %d pages, want at most %.0f", seed, r.sent, pages, lim)
		}
	}
}

// A record a hold old counts from the host's first refusal: the burst its
// second accepted before that is not what the host takes now. A bucket of
// 14/s with a burst of 28, spent by 5 callers in 0.2 s, then refused most
// of what they sent, and the second's accepted burst hid it for a second
// more: the pace came 1.0-1.4 s after the first 503, and the pages whose
// three tries fell in that second were lost (9 pages in 8 runs).
// Refused more than twice as often as it accepted since its first refusal
// (what is in flight counted as accepted), the host is paced within half
// a second, in most runs: a few depend on the goroutines' order.
func TestFreshRefusalsCountFromTheFirst(t *testing.T) {
	h := &simBucketCfg{rate1: 14, burst: 28, code: 503, lat: 30 * time.Millisecond}
	const pages = 28 + 15*14
	d := simDraw{
		mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
		pages: pages, workers: 5, ideal: time.Second, slow: 100, need: pages, minGot: pages,
	}
	soon := 0
	for seed := range uint64(8) {
		r := runSim(t, d, seed, true)
		first, paced := -1.0, -1.0
		for _, l := range r.trace {
			f := strings.Fields(l)
			at, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "s"), 64)
			if err != nil {
				continue
			}
			if first < 0 && strings.Contains(l, ": 503 in") {
				first = at
			}
			if paced < 0 && strings.Contains(l, "learned pace") {
				paced = at
			}
		}
		if first >= 0 && paced >= 0 && paced-first <= 0.5 {
			soon++
		}
	}
	if soon < 6 {
		t.Errorf("paced within 0.5 s of the first 503 in %d runs of 8, want 6 at least", soon)
	}
}

// limitReqHost is nginx's limit_req with no burst, and its default
// refusal: a request that comes within 1/rate of the last one it let
// through is answered 503, with nothing else said.
type limitReqHost struct {
	mu       sync.Mutex
	every    time.Duration
	last     time.Time
	requests int
}

func (h *limitReqHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer time.Sleep(time.Millisecond)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests++
	if now := time.Now(); h.last.IsZero() || now.Sub(h.last) >= h.every {
		h.last = now
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

// Nothing sent one at a time overloads a host's capacity, but it can come
// too soon for its rate: one caller fetching pages one after another from
// nginx's limit_req (10 a second, no burst, a bare 503) was refused the
// page after each it got, and the retry after a backoff got it. Its 503s
// were taken for a failing host's: never paced, 2.2 requests a page, and
// the retry budget handed back 10-22 pages in 100. The refusals that come
// soon after an accepted attempt, and the accepted after a wait, say a
// rate (spacing); the cut is then checked like any other, so a host that
// refuses every other request whatever the pace is failing again within
// seconds (TestHostModelSequentialFlaky).
func TestSequentialCallerPacedByLimitReq(t *testing.T) {
	for seed := range uint64(5) {
		synctest.Test(t, func(t *testing.T) {
			host := &limitReqHost{every: 100 * time.Millisecond}
			net := newPipeNet(host)
			defer net.close()
			rnd := rand.New(rand.NewPCG(seed, 7))
			tr := New(WithBase(net.tr), WithRand(rnd.Float64))
			got := 0
			for i := range 100 {
				if code, _ := get(t, tr, "http://limited.test/p/"+strconv.Itoa(i)); code == http.StatusOK {
					got++
				}
			}
			st, _ := tr.HostStatus(context.Background(), "limited.test")
			t.Logf("seed %d: %d pages, %d requests; host %v, pace %v", seed, got, host.requests, st.State, st.Pace.Limit)
			if got < 100 || host.requests > 130 {
				t.Errorf("seed %d: %d of 100 pages in %d requests, want every page within 1.3 requests a page", seed, got, host.requests)
			}
			if st.State != HostOverloaded {
				t.Errorf("seed %d: host %v, want overloaded (paced)", seed, st.State)
			}
		})
	}
}

// TestSpacingTellsRateFromChance draws one caller's attempts, each sent at
// once after an accepted answer or after a full-jitter backoff after a
// refusal, against a host that refuses at random (any share, whatever the
// gap) and against one that refuses whatever comes within its interval of
// the last it accepted: within 60 attempts the gaps say a rate for the
// second, and not for the first, in all but one draw of 100 at most.
func TestSpacingTellsRateFromChance(t *testing.T) {
	const draws = 400
	var falseRate, missedRate int
	for seed := range uint64(draws) {
		r := rand.New(rand.NewPCG(seed, 99))
		share := 0.05 + 0.9*r.Float64()                           // the random host's share refused
		every := time.Duration(20+r.IntN(480)) * time.Millisecond // the limit's interval
		for _, limit := range []bool{false, true} {
			var s spacing
			now, lastOK := instant(time.Second), instant(0)
			told := false
			for range 60 {
				refused := r.Float64() < share
				if limit {
					refused = !lastOK.IsZero() && now.Sub(lastOK) < every
				}
				s.answered(now, refused, true)
				told = told || (refused && s.closer())
				if !refused {
					lastOK = now
				}
				gap := time.Millisecond // the next page at once
				if refused {
					gap = time.Duration(r.Float64() * float64(500*time.Millisecond)) // a backoff
				}
				now = now.Add(gap + time.Millisecond)
			}
			switch {
			case limit && !told:
				missedRate++
			case !limit && told:
				falseRate++
			}
		}
	}
	if missedRate > draws/100 || falseRate > draws/100 {
		t.Errorf("of %d draws: %d limits not told a rate, %d random hosts taken for one (at most %d each)", draws, missedRate, falseRate, draws/100)
	}
}

// TestCutCheckedWhileBelowIt: a bucket of 10 a second (burst 5) in front of
// a replica failing 20 % of what it serves, both with a bare 503, met by
// 30 callers. Once overloaded, every refusal is load, and the replica's
// cut the pace one at a time; each cut's check, which would find the share
// refused unmoved (chance), was cleared by the pace's growth a hold later,
// so none was ever made: paced at 1-2 a second for minutes, 300 pages in
// 1.5-4 min (ideal 30 s). A pace still below the one before its cut is
// still the cut's, and its check stands: the replica's share is found
// chance within a minute. (Not its ideal yet: the checks read a few
// answers a second.)
func TestCutCheckedWhileBelowIt(t *testing.T) {
	const runs = 12
	var times []time.Duration
	for seed := range uint64(runs) {
		synctest.Test(t, func(t *testing.T) {
			host := &bucketReplicaHost{rate: 10, burst: 5, fail: 0.2, failWith: http.StatusServiceUnavailable,
				refuse: http.StatusServiceUnavailable, rnd: rand.New(rand.NewPCG(3, 20+seed))}
			net := newPipeNet(host)
			defer net.close()
			tr := New(WithBase(net.tr))
			out := runPages(t, tr, "http://bucket.test", 30, 300)
			t.Logf("seed %d: %+v, %d requests", seed, out, host.requests)
			times = append(times, out.done)
		})
	}
	// 44-85 s in most runs; over 100 s in about one run in 15, and up to
	// 226 s, under -race as without (300 runs, 2026-12-07: about one test
	// in eight under -race had two over 100 s, or one over 150 s, which
	// the bound of one slow run in six did not allow). Before the fix, 4
	// or 5 of these 12 over 100 s in every run (up to 4 min 20 s; median
	// 53-71 s): the median and a quarter tell the two apart.
	slices.Sort(times)
	slow := 0
	for _, d := range times {
		if d > 100*time.Second {
			slow++
		}
	}
	if median := times[runs/2]; median > 85*time.Second || slow > runs/4 {
		t.Errorf("300 pages took %v (median %v, %d over 100 s); want a median within 85 s, a quarter over 100 s at most", times, median, slow)
	}
}

// TestSpacedBurstSlowStart: nginx's limit_req at 10 a second with no burst
// takes one of a burst sent at once and refuses the rest: what it took
// says nothing of its rate, and a pace cut to it crept up from 1 a second
// by 5 %, 15 %, 45 %, then doubling, for seconds: 100 pages by 10 callers
// in 17.6 s (ideal 9.9 s). The pace doubles each hold from the burst, and
// the pages take 14.1-14.9 s (the property's 1.3x is still missed: the slow
// start's first seconds and a probe's refusal).
func TestSpacedBurstSlowStart(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		h := &simBucketCfg{rate1: 10, burst: 1, code: code, lat: 2 * time.Millisecond}
		d := simDraw{
			mk:    func() simHost { return &simBucketHost{simBucketCfg: *h} },
			pages: 100, workers: 10, ideal: 9900 * time.Millisecond, slow: 1.6, need: 100, minGot: 100,
		}
		for seed := range uint64(3) {
			r := runSim(t, d, seed, false)
			if miss := simCheck(d, r); len(miss) > 0 {
				t.Errorf("%d, seed %d: %s (%s)", code, seed, strings.Join(miss, "; "), simFigures(d, r))
			}
		}
	}
}
