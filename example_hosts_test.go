package retryhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/retryhttp/retryhttp"
)

// hostView is one host as the operator's page shows it.
type hostView struct {
	Host        string    `json:"host"`
	State       string    `json:"state"`
	Since       time.Time `json:"since,omitzero"`
	Pace        float64   `json:"pace_per_second,omitempty"` // learned; 0: none
	InFlight    int       `json:"limit_in_flight,omitempty"`
	ParkedUntil time.Time `json:"parked_until,omitzero"`
	ForgetAt    time.Time `json:"forget_at"`
}

// hostsHandler serves what tr holds of each host as JSON, sorted by host.
func hostsHandler(tr *retryhttp.Transport) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var hosts []hostView
		for st := range tr.Hosts() {
			v := hostView{Host: st.Host, State: st.State.String(), Since: st.Since, InFlight: st.InFlight,
				ParkedUntil: st.ParkedUntil, ForgetAt: st.ForgetAt}
			if !st.Pace.Unlimited() {
				v.Pace = math.Round(float64(st.Pace.Limit)*100) / 100
			}
			hosts = append(hosts, v)
		}
		slices.SortFunc(hosts, func(a, b hostView) int { return strings.Compare(a.Host, b.Host) })
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(hosts)
	})
}

// frozen is a clock that stands still, so that the output below is the
// same at every run.
type frozen struct{ t time.Time }

func (c frozen) Now() time.Time                                   { return c.t }
func (c frozen) Sleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

// answers is a base that answers each host as a map says.
type answers map[string]*http.Response

func (a answers) RoundTrip(r *http.Request) (*http.Response, error) {
	resp := *a[r.URL.Host]
	resp.Request, resp.Body = r, http.NoBody
	return &resp, nil
}

// An operator's view of the hosts a Transport holds a record of, served as
// JSON: a host that fails, one that parked itself with Retry-After, one
// that announced its quota. A host that never misbehaved (ok.test) has no
// record and is not listed; each record says when it will be forgotten.
func ExampleTransport_Hosts() {
	base := answers{
		"ok.test":      {StatusCode: 200},
		"broken.test":  {StatusCode: 500},
		"limited.test": {StatusCode: 429, Header: http.Header{"Retry-After": {"30"}}},
		"quota.test": {StatusCode: 200, Header: http.Header{
			"X-Ratelimit-Limit": {"100"}, "X-Ratelimit-Remaining": {"99"}, "X-Ratelimit-Reset": {"60"}}},
	}
	clock := frozen{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	tr := retryhttp.New(retryhttp.WithBase(base), retryhttp.WithClock(clock), retryhttp.WithMaxAttempts(1))
	for host := range base {
		req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}

	rec := httptest.NewRecorder()
	hostsHandler(tr).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/hosts", nil))
	fmt.Print(rec.Body.String())
	// Output:
	// [
	//   {
	//     "host": "broken.test",
	//     "state": "failing",
	//     "since": "2026-01-02T03:04:05Z",
	//     "forget_at": "2026-01-02T03:05:05Z"
	//   },
	//   {
	//     "host": "limited.test",
	//     "state": "healthy",
	//     "since": "2026-01-02T03:04:05Z",
	//     "parked_until": "2026-01-02T03:04:35Z",
	//     "forget_at": "2026-01-02T03:05:05Z"
	//   },
	//   {
	//     "host": "quota.test",
	//     "state": "healthy",
	//     "since": "2026-01-02T03:04:05Z",
	//     "pace_per_second": 1.67,
	//     "forget_at": "2026-01-02T03:05:05Z"
	//   }
	// ]
}
