package retryotel

import (
	"net/http"
	"testing"

	"github.com/retryhttp/retryhttp"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// byHost answers each host with the status of a map, and Retry-After: 30
// on a 429.
type byHost map[string]int

func (b byHost) RoundTrip(r *http.Request) (*http.Response, error) {
	resp := &http.Response{StatusCode: b[r.URL.Host], Header: http.Header{}, Body: http.NoBody, Request: r}
	if resp.StatusCode == http.StatusTooManyRequests {
		resp.Header.Set("Retry-After", "30")
	}
	return resp, nil
}

// intGauge is the points of an int64 gauge, by the value of StateKey
// ("" for none).
func intGauge(t *testing.T, rm metricdata.ResourceMetrics, name string) map[string]int64 {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			out := map[string]int64{}
			for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				v, _ := p.Attributes.Value(StateKey)
				out[v.AsString()] = p.Value
			}
			return out
		}
	}
	return nil
}

// The host gauges count the hosts the Transport holds by state, every
// state reported, and those parked; a host that never misbehaved counts
// nowhere; unregistered, they report nothing.
func TestHostGauges(t *testing.T) {
	r := newRig(t)
	base := byHost{"ok.test": 200, "broken.test": 500, "also-broken.test": 500, "limited.test": 429}
	tr := r.transport(base, retryhttp.WithMaxAttempts(1))
	reg, err := r.inst.Observe(tr)
	if err != nil {
		t.Fatal(err)
	}
	for host := range base {
		resp, err := do(t, t.Context(), tr, "http://"+host+"/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	rm := r.collect(t)
	got := intGauge(t, rm, "retryhttp.client.hosts")
	want := map[string]int64{"healthy": 1, "failing": 2, "overloaded": 0, "down": 0, "recovering": 0}
	if len(got) != len(want) {
		t.Errorf("hosts by state %v, want %v", got, want)
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("%s: %d hosts, want %d (all: %v)", s, got[s], n, got)
		}
	}
	if parked := intGauge(t, rm, "retryhttp.client.hosts.parked"); parked[""] != 1 {
		t.Errorf("parked hosts %v, want 1", parked)
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got := intGauge(t, r.collect(t), "retryhttp.client.hosts"); len(got) != 0 {
		t.Errorf("host gauge after Unregister: %v", got)
	}
}
