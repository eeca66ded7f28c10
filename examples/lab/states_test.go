package main

import (
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
)

// The rows of the host model's states, checked exactly as the others are;
// each test also says what the row is meant to show, and checks that it
// does where it does.

func TestReplicas(t *testing.T) {
	check(t, "naive, 3 tries at once", ReplicasNaive(), want{746, 149, 597, "1.0 s"}, secs)

	rh := ReplicasRetryhttp()
	check(t, "retryhttp, defaults", rh, want{741, 148, 593, "3.6 s"}, secs)
	// A failing host, not an overloaded one: never paced, nothing handed
	// back, at least 590 of the 600 pages.
	if !slices.Equal(rh.Seen.States, []retryhttp.HostState{retryhttp.HostFailing}) || rh.Seen.Paced || len(rh.Seen.Limits) > 0 {
		t.Errorf("retryhttp held the host %+v, want failing throughout, never paced", rh.Seen)
	}
	if rh.Unsent != 0 || rh.Served < 590 {
		t.Errorf("retryhttp: %d served, %d handed back; want at least 590, none handed back", rh.Served, rh.Unsent)
	}
	// As fast as with learning off: learning costs the failing host
	// nothing.
	off := ReplicasRetryhttp(retryhttp.WithLearning(false))
	check(t, "retryhttp, learning off", off, want{741, 148, 593, "3.6 s"}, secs)
	if rh.Done > off.Done {
		t.Errorf("retryhttp done at %v, learning off at %v: learning slowed a failing host", rh.Done, off.Done)
	}
}

func TestRestart(t *testing.T) {
	naive := RestartNaive()
	naive.Arrivals = nil
	wantNaive := Recovery{During: 2685, GaveUp: 790, Served: 1710, Next: 300, Busiest: 300, BusyAt: 15 * time.Second,
		Longest: 2150 * time.Millisecond}
	if !reflect.DeepEqual(naive, wantNaive) {
		t.Errorf("naive: %+v\nwant   %+v", naive, wantNaive)
	}

	rh := RestartRetryhttp()
	if got := len(rh.Arrivals); got != 1579 {
		t.Errorf("retryhttp: %d requests reached the host, want 1579", got)
	}
	rh.Arrivals = nil
	wantRH := Recovery{During: 85, Unsent: 939, AtOnce: 838, GaveUp: 67, Served: 1494, Next: 94, Busiest: 100,
		BusyAt: 16 * time.Second, Longest: 1643512817, LongestUnsent: 1013903130} // 1.64 s, 1.014 s
	if !reflect.DeepEqual(rh, wantRH) {
		t.Errorf("retryhttp: %+v\nwant       %+v", rh, wantRH)
	}
	// What the row is meant to show: during the outage the host gets a
	// small share of what the callers ask (1000 requests in the 10 s), the
	// rest are handed back unsent; after the return it is served at its
	// old rate (100 a second) within a second, and no flood follows: no
	// second busier than that rate, no caller left waiting.
	asked := int(restartUp-restartDown) / int(restartEvery)
	old := int(time.Second / restartEvery)
	if rh.During*10 > asked || rh.Unsent < asked*8/10 {
		t.Errorf("retryhttp: %d of %d sent during the outage, %d handed back", rh.During, asked, rh.Unsent)
	}
	if rh.Next < old*9/10 || rh.Busiest > old*11/10 || rh.Longest > 3*time.Second {
		t.Errorf("retryhttp: %d served in the second after the return, busiest second %d, longest call %v; want about %d, at most %d, a few seconds",
			rh.Next, rh.Busiest, rh.Longest, old, old*11/10)
	}
}

func TestSlots(t *testing.T) {
	check(t, "naive, 1 s after a 503", SlotsNaive(), want{730, 130, 600, "7.1 s"}, secs)
	check(t, "naive, at once", SlotsAtOnce(), want{24000, 23400, 600, "6.0 s"}, secs)

	rh := SlotsRetryhttp()
	check(t, "retryhttp, defaults", rh, want{620, 20, 600, "6.0 s"}, secs)
	// The refusals came back at once while the slots were busy: the
	// callers were held for a slot, and that hold was the host's limit
	// once the slots answered (before, 3 at first, grown one at a time).
	if want := []int{10}; !slices.Equal(rh.Seen.Limits, want) ||
		!slices.Equal(rh.Seen.States, []retryhttp.HostState{retryhttp.HostOverloaded}) {
		t.Errorf("retryhttp held the host %+v, want overloaded, limits %v in flight", rh.Seen, want)
	}
	// What the row is meant to show: a limit of about 10 in flight, every
	// page, at most 1.15 requests a page, within about 9 s.
	limit := rh.Seen.Limits[len(rh.Seen.Limits)-1]
	if limit < slotsSize-1 || limit > slotsSize+1 || rh.Served != slotsPages || rh.Unsent != 0 ||
		float64(rh.Requests) > 1.15*slotsPages || rh.Done > 9*time.Second {
		t.Errorf("retryhttp: limit %d, %d of %d pages, %d requests, done at %v", limit, rh.Served, slotsPages, rh.Requests, rh.Done)
	}
}

// TestWatchingChangesNothing checks that asking the Transport what it holds
// of the host after every page leaves the runs as they are unwatched.
func TestWatchingChangesNothing(t *testing.T) {
	for _, run := range []struct {
		name string
		f    func(bool, ...retryhttp.Option) Outcome
	}{{"replicas", replicasRun}, {"slots", slotsRun}} {
		watched, unwatched := run.f(true), run.f(false)
		if watched.Requests != unwatched.Requests || watched.Served != unwatched.Served ||
			!slices.Equal(watched.Arrivals, unwatched.Arrivals) || watched.Done != unwatched.Done {
			t.Errorf("%s: watched %d sent, %d served, done at %v; unwatched %d, %d, %v", run.name,
				watched.Requests, watched.Served, watched.Done, unwatched.Requests, unwatched.Served, unwatched.Done)
		}
	}
}

// TestReplicasHost checks the balancer: one request in five, the fifth of
// each turn, answered 503 at once; the others served in 50 ms.
func TestReplicasHost(t *testing.T) {
	w := newWorld()
	host := w.addReplicas()
	client := w.naiveClient()
	var got []string
	w.clock.Run(func() {
		for range 10 {
			start := w.clock.Since()
			status, _ := mustGet(client, replicaURL(1))
			got = append(got, http.StatusText(status)+" in "+short(w.clock.Since()-start))
		}
	})
	ok, broken := "OK in 50 ms", "Service Unavailable in 5 ms"
	want := []string{ok, ok, ok, ok, broken, ok, ok, ok, ok, broken}
	if !slices.Equal(got, want) {
		t.Errorf("answers %q, want %q", got, want)
	}
	if host.Log.Count(http.StatusServiceUnavailable) != 2 {
		t.Errorf("log: %d answered 503, want 2", host.Log.Count(http.StatusServiceUnavailable))
	}
}

// TestSlotsHost checks the host with 10 slots: 11 requests at once get 10
// answers of 200 in 100 ms and one 503 in 5 ms; a slot is free again when
// its 100 ms are over, not before.
func TestSlotsHost(t *testing.T) {
	w := newWorld()
	host := w.addSlots()
	client := w.naiveClient()
	for range 11 {
		w.clock.Go(func() { mustGet(client, slotsURL(1)) })
	}
	w.clock.Go(func() {
		w.sleep(99 * time.Millisecond)
		mustGet(client, slotsURL(1)) // all 10 still busy: 503
		w.sleep(time.Millisecond)    // 105 ms: the first 10 are done
		mustGet(client, slotsURL(1))
	})
	w.clock.Run()
	if ok, busy := host.Log.Count(http.StatusOK), host.Log.Count(http.StatusServiceUnavailable); ok != 11 || busy != 2 {
		t.Errorf("%d served, %d answered 503; want 11, 2", ok, busy)
	}
}

// TestRestartedHost checks the outage's edges: 503 from 5 s, served again
// from 15 s.
func TestRestartedHost(t *testing.T) {
	w := newWorld()
	w.addRestarted()
	client := w.naiveClient()
	var got []int
	w.clock.Run(func() {
		for _, at := range []time.Duration{4999 * time.Millisecond, 5 * time.Second, 14999 * time.Millisecond, 15 * time.Second} {
			w.sleep(at - w.clock.Since())
			status, _ := mustGet(client, restartURL(1))
			got = append(got, status)
		}
	})
	if want := []int{200, 503, 503, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}
