package retryhttp

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// hostsOf collects what Hosts yields, by host.
func hostsOf(tr *Transport) map[string]HostStatus {
	out := map[string]HostStatus{}
	for st := range tr.Hosts() {
		out[st.Host] = st
	}
	return out
}

// Hosts lists the hosts held, each with its state, parking and when it is
// forgotten, and none that never misbehaved; once forgotten, none.
func TestHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := relRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch r.URL.Host {
			case "broken.test":
				return relResponse(r, 500, nil, nil, 0), nil
			case "limited.test":
				return relResponse(r, 429, http.Header{"Retry-After": {"30"}}, nil, 0), nil
			case "quota.test":
				return relResponse(r, 200, http.Header{"X-Ratelimit-Limit": {"10"}, "X-Ratelimit-Remaining": {"9"},
					"X-Ratelimit-Reset": {"1"}}, nil, 0), nil
			}
			return relResponse(r, 200, nil, nil, 0), nil
		})
		tr := New(WithBase(base), WithMaxAttempts(1), WithHostPace("paced.test", 1, 1))
		start := time.Now()
		for _, h := range []string{"ok.test", "broken.test", "limited.test", "quota.test", "paced.test", "paced.test"} {
			crawl(t, tr, "http://"+h+"/")
		}
		got := hostsOf(tr)
		if len(got) != 4 {
			t.Fatalf("%d hosts listed, want 4 (all but ok.test): %v", len(got), got)
		}
		if st := got["broken.test"]; st.State != HostFailing || !st.ForgetAt.Equal(start.Add(forgetAfter)) {
			t.Errorf("broken.test: %+v; want failing, forgotten at %v", st, start.Add(forgetAfter))
		}
		if st := got["limited.test"]; !st.ParkedUntil.Equal(start.Add(30 * time.Second)) {
			t.Errorf("limited.test: %+v; want parked 30 s", st)
		}
		if st := got["quota.test"]; st.Pace.Unlimited() {
			t.Errorf("quota.test: %+v; want its quota's pace", st)
		}
		if st := got["paced.test"]; st.State != HostHealthy || !st.ForgetAt.After(start) {
			t.Errorf("paced.test: %+v; want healthy, held while its bucket refills", st)
		}
		if st, _ := tr.HostStatus(context.Background(), "HTTP://Broken.test:80/x"); st.Host != "broken.test" {
			t.Errorf("HostStatus names the host %q, want broken.test", st.Host)
		}
		// The loop runs with no lock held: it may send through the
		// Transport, to a host of any shard.
		n := 0
		for st := range tr.Hosts() {
			crawl(t, tr, "http://"+st.Host+"/")
			n++
			break
		}
		if n != 1 {
			t.Errorf("a loop that breaks ran %d times", n)
		}
		time.Sleep(forgetAfter + time.Second)
		if got := hostsOf(tr); len(got) != 0 {
			t.Errorf("%d hosts listed a minute after their last word, want none: %v", len(got), got)
		}
		if e, _, _ := limiterCounts(tr.limiter.(*localLimiter)); e != 0 {
			t.Errorf("%d entries left after Hosts swept", e)
		}
	})
}

// otherLimiter is a Limiter of another kind than the in-process one.
type otherLimiter struct{ Limiter }

// With a Limiter of its own (WithLimiter), Hosts lists what this process
// holds; a Transport not made by New lists nothing.
func TestHostsOtherLimiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := failingCrawler(WithLimiter(otherLimiter{newLocalLimiter(realClock{})}))
		if _, ok := tr.limiter.(*sharedLimiter); !ok {
			t.Fatalf("limiter %T, want the model beside the one given", tr.limiter)
		}
		crawl(t, tr, "http://broken.test/")
		if got := hostsOf(tr); len(got) != 1 || got["broken.test"].State != HostFailing {
			t.Errorf("with WithLimiter: %v, want broken.test failing", got)
		}
		for st := range new(Transport).Hosts() {
			t.Errorf("a zero Transport lists %+v", st)
		}
	})
}
