package retryhttp

import (
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-cleanhttp"
)

// R3: what may be repeated once it may have reached the server.
func TestIdempotency(t *testing.T) {
	tests := []struct {
		method  string
		headers map[string]string
		status  int
		want    int
	}{
		{"GET", nil, 503, 3},
		{"HEAD", nil, 503, 3},
		{"OPTIONS", nil, 503, 3},
		{"TRACE", nil, 503, 3},
		{"PUT", nil, 503, 3},
		{"DELETE", nil, 503, 3},
		{"POST", nil, 503, 1},
		{"PATCH", nil, 503, 1},
		{"POST", map[string]string{"Idempotency-Key": "k1"}, 503, 3},
		{"POST", map[string]string{"X-Idempotency-Key": "k1"}, 503, 3},
		{"POST", map[string]string{"Idempotency-Key": ""}, 503, 1},
		{"POST", nil, 429, 3}, // the server did not act on a 429
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			host := newStub(map[string][]step{"/": {{status: tt.status}}})
			net := newPipeNet(host)
			defer net.close()
			var ev events
			tr := New(WithBase(net.tr), WithBudget(nil), onEvents(ev.add))
			resp, err := send(tr, tt.method, "http://x.test/", "body", tt.headers)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := host.count(""); got != tt.want {
				t.Errorf("%s %v answered %d: %d requests, want %d", tt.method, tt.headers, tt.status, got, tt.want)
			}
			if tt.want == 1 {
				evs := ev.list()
				if len(evs) != 1 || evs[0].Reason != ReasonNotIdempotent {
					t.Errorf("events %+v, want one saying %q", evs, ReasonNotIdempotent)
				}
			}
		})
	}
}

// R3: a POST whose connection dies after the server read it and acted on it
// reaches the server exactly once; one whose connection was never made is
// sent again.
func TestPostSentOnce(t *testing.T) {
	var executed atomic.Int32
	srv := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		executed.Add(1)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	tr := New(WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
	if _, err := send(tr, "POST", srv.URL, "charge 10 EUR", nil); err == nil {
		t.Fatal("no error from a connection closed without an answer")
	}
	if got := executed.Load(); got != 1 {
		t.Errorf("the POST was executed %d times, want exactly 1", got)
	}
	// The same with a key: retried, so executed 3 times in all.
	executed.Store(0)
	send(tr, "POST", srv.URL, "charge 10 EUR", map[string]string{"Idempotency-Key": "abc"})
	if got := executed.Load(); got != 3 {
		t.Errorf("the keyed POST was executed %d times, want 3", got)
	}

	// Connection refused: nothing was sent, so even a POST is retried.
	base := &countingBase{base: cleanhttp.DefaultTransport()}
	tr = New(WithBase(base), WithBackoff(time.Millisecond, time.Millisecond), WithBudget(nil))
	_, err := send(tr, "POST", "http://"+closedPort(t)+"/", "charge", nil)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v, want one that errors.Is ECONNREFUSED", err)
	}
	if got := base.attempts.Load(); got != 3 {
		t.Errorf("a POST that never left: %d attempts, want 3", got)
	}
}

// R3: WithAutoIdempotencyKey adds one random UUID v4 key before the first
// try and sends it on every retry, leaving the caller's headers alone.
func TestAutoIdempotencyKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/pay": {{status: 503}, {status: 502}, {status: 201}}})
		net := newPipeNet(host)
		defer net.close()
		var ev events
		tr := New(WithBase(net.tr), WithAutoIdempotencyKey(), WithBudget(nil), onEvents(ev.add))
		req, _ := http.NewRequest("POST", "http://x.test/pay", strings.NewReader("amount=10"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		hits := host.all()
		if len(hits) != 3 || resp.StatusCode != 201 {
			t.Fatalf("%d requests, status %d; want 3 and 201", len(hits), resp.StatusCode)
		}
		uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
		for _, h := range hits {
			if h.key != hits[0].key || !uuid4.MatchString(h.key) {
				t.Errorf("keys %q and %q: want one UUID v4 on every try", hits[0].key, h.key)
			}
		}
		if _, ok := req.Header["Idempotency-Key"]; ok {
			t.Error("the caller's request gained a key")
		}
		for _, e := range ev.list() {
			if e.Key != hits[0].key {
				t.Errorf("event key %q, want the key sent, %q", e.Key, hits[0].key)
			}
		}
		// A caller's own key is kept, and GETs get none.
		if resp, err := send(tr, "POST", "http://x.test/own", "x", map[string]string{"Idempotency-Key": "mine"}); err == nil {
			resp.Body.Close()
		}
		get(t, tr, "http://x.test/get")
		hits = host.all()
		if hits[3].key != "mine" || hits[4].key != "" {
			t.Errorf("keys %q and %q, want the caller's and none", hits[3].key, hits[4].key)
		}
	})
}
