package retryhttp

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// slotsHost serves slots requests at a time, each for service, and
// refuses with a bare 503 what comes beyond them (HAProxy's maxconn
// without a queue, a full semaphore); a host name starting "dead" answers
// 503 to everything, and one starting "slow" holds its requests for a
// minute.
type slotsHost struct {
	slots   chan struct{}
	service time.Duration
}

func (h *slotsHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.Host, "dead"):
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case strings.HasPrefix(r.Host, "slow"):
		select {
		case <-time.After(time.Minute):
		case <-r.Context().Done():
		}
		return
	}
	select {
	case h.slots <- struct{}{}:
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	time.Sleep(h.service)
	<-h.slots
	w.Write([]byte("ok"))
}

// TestSlowLimitInFlightNotDown: a host that serves 7 requests at a time,
// each for 1.5 s, refuses the rest of an opening burst of 9 at once, and
// its first answers are all refusals: it is not taken for down while the
// 7 it serves are on their way (the synthetic host of inFlight:12 lost 81
// of 92 pages to ErrHostDown that way).
func TestSlowLimitInFlightNotDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := &slotsHost{slots: make(chan struct{}, 7), service: 1500 * time.Millisecond}
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr))
		var down, got atomic.Int32
		var next atomic.Int32
		var wg sync.WaitGroup
		for range 9 {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > 60 {
						return
					}
					resp, err := send(tr, http.MethodGet, "http://limited.test/p/"+strconv.Itoa(int(i)), "", nil)
					switch {
					case errors.Is(err, ErrHostDown):
						down.Add(1)
					case err == nil:
						if resp.StatusCode == http.StatusOK {
							got.Add(1)
						}
						readAll(resp)
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d of 60 pages, %d handed back as down", got.Load(), down.Load())
		if down.Load() > 0 {
			t.Errorf("%d requests failed with ErrHostDown: a host serving 7 at a time is not down", down.Load())
		}
	})
}

// TestDownWhileOthersSlow: a host that answers 503 to everything is still
// found down while the process has 20 slow requests on their way to
// another host (which its record counts as attempts that may yet get
// through): within ghostWait and a few of its runs.
func TestDownWhileOthersSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := newPipeNet(&slotsHost{slots: make(chan struct{}, 1)})
		defer net.close()
		tr := New(WithBase(net.tr))
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				resp, err := sendCtx(ctx, tr, http.MethodGet, "http://slow.test/"+strconv.Itoa(i), "", nil)
				if err == nil {
					readAll(resp)
				}
			})
		}
		time.Sleep(time.Millisecond)
		start := time.Now()
		var downAt time.Duration
		for range 200 {
			resp, err := send(tr, http.MethodGet, "http://dead.test/", "", nil)
			if errors.Is(err, ErrHostDown) {
				downAt = time.Since(start)
				break
			}
			if err == nil {
				readAll(resp)
			}
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		t.Logf("down after %v", downAt)
		if downAt == 0 || downAt > ghostWait+3*time.Second {
			t.Errorf("found down after %v (0: never), want within %v", downAt, ghostWait+3*time.Second)
		}
	})
}

// TestOneCallerOverSlotsNotFailing: six callers at a host that serves five
// at a time (200 ms each) and refuses the sixth with a bare 503: the five
// fill the slots again as each is answered, so the sixth is refused every
// try, 15 % of what the host is sent, which read as a host failing at
// random: 142-145 of 150 pages, the host "failing" (inFlight:29 of the
// simulator lost one in twenty). Refused with more in flight than the
// host accepted at once, it is a limit in flight, held to: 148-149 of 150
// in 30 runs, the pages lost those of the opening, whose burst was sent
// before the host had a record (so its tries' loads did not count it).
func TestOneCallerOverSlotsNotFailing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := &slotsHost{slots: make(chan struct{}, 5), service: 200 * time.Millisecond}
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr))
		const pages = 150
		var got, next atomic.Int32
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				for next.Add(1) <= pages {
					resp, err := send(tr, http.MethodGet, "http://slots.test/", "", nil)
					if err == nil {
						if resp.StatusCode == http.StatusOK {
							got.Add(1)
						}
						readAll(resp)
					}
				}
			})
		}
		wg.Wait()
		st, _ := tr.HostStatus(context.Background(), "slots.test")
		t.Logf("%d of %d pages; host %v, limit in flight %d", got.Load(), pages, st.State, st.InFlight)
		if got.Load() < pages-2 || st.State != HostOverloaded || st.InFlight == 0 {
			t.Errorf("%d of %d pages, host %v, limit in flight %d; want every page but two, held to a limit in flight", got.Load(), pages, st.State, st.InFlight)
		}
	})
}

// TestRefusedAtOnceHeldForSlot: a host serving 7 requests at once for 0.9 s
// each, refusing the rest at once with a bare 503, met by 13 callers: the
// 6 refused at once were retried 0 to 0.5 s later, while the slots were
// still busy, refused again, and lost on their third refusal (3 pages of
// 242, inFlight:0 of the simulator). Held for an answer of those on their
// way, the refused wait for a slot, and that hold, answered a service time
// after the refusals, is the host's limit in flight: every page, in every
// run.
func TestRefusedAtOnceHeldForSlot(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			const (
				pages   = 242
				slots   = 7
				service = 883 * time.Millisecond
			)
			d := simDraw{
				mk: func() simHost {
					return &simSlotsHost{n: slots, service: service, timeout: time.Hour, code: code, slots: make(chan struct{}, slots)}
				},
				pages: pages, workers: 13, ideal: (pages + slots - 1) / slots * service, slow: 1.3, need: pages, minGot: pages,
			}
			for seed := range uint64(4) {
				r := runSim(t, d, seed, false)
				if miss := simCheck(d, r); len(miss) > 0 {
					t.Errorf("seed %d: %s (%s)", seed, strings.Join(miss, "; "), simFigures(d, r))
				}
			}
		})
	}
}

// TestBucketBurstBeforeFlakyReplicaNotDown: a bucket of 20 a second with a
// burst of 20, bare 503 when empty, in front of a replica failing 10 % at
// random (500, 502 or 503), met by 30 callers: its burst's refusals, all
// sent before any came back, counted as 20 failures in a row, and when the
// replica failed the first attempt or two after them the host was taken
// for down: 350 of 400 pages handed back with ErrHostDown in about one
// draw in twenty. A burst's answers are one chance the host had, not one
// each (failures.chances).
func TestBucketBurstBeforeFlakyReplicaNotDown(t *testing.T) {
	for seed := range uint64(40) {
		d := simDraw{pages: 400, workers: 30, ideal: 20 * time.Second, slow: 2, need: 400, minGot: 380}
		d.mk = func() simHost {
			return &simBucketHost{simBucketCfg: simBucketCfg{rate1: 20, burst: 20, code: http.StatusServiceUnavailable, lat: 20 * time.Millisecond,
				behind: &simFlaky{rnd: rand.New(rand.NewPCG(seed, 1)), p: 0.1}}}
		}
		r := runSim(t, d, seed, false)
		down := 0
		for _, p := range r.pages {
			if p.err == "down" {
				down++
			}
		}
		if down > 0 {
			t.Errorf("replica seed %d: %d of %d pages handed back as down (%s)", seed, down, d.pages, simFigures(d, r))
		}
	}
}
