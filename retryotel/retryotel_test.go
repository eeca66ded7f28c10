package retryotel

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// rig is what every test needs: an SDK tracer and meter provider recording
// in memory, and an Instrumentation reporting to them.
type rig struct {
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	inst   *Instrumentation
}

func newRig(t *testing.T, opts ...Option) *rig {
	t.Helper()
	r := &rig{rec: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.rec))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		r.tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	r.inst = New(append([]Option{WithTracerProvider(r.tp), WithMeterProvider(mp)}, opts...)...)
	return r
}

// transport is a retryhttp Transport reporting to the rig, fast enough for
// tests: millisecond backoff with fixed jitter, no budget in the way.
func (r *rig) transport(base http.RoundTripper, opts ...retryhttp.Option) *retryhttp.Transport {
	all := append(r.inst.Options(),
		retryhttp.WithBase(r.inst.Base(base)),
		retryhttp.WithBackoff(time.Millisecond, 2*time.Millisecond),
		retryhttp.WithRand(func() float64 { return 0.5 }),
		retryhttp.WithBudget(nil))
	return retryhttp.New(append(all, opts...)...)
}

func (r *rig) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	return rm
}

// script serves the statuses in order, then the last one for ever, and
// counts the requests.
func script(t *testing.T, statuses ...int) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		i := int(n.Add(1)) - 1
		w.WriteHeader(statuses[min(i, len(statuses)-1)])
		io.WriteString(w, "body")
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// do sends a GET of url with ctx through rt and reads and closes the
// response, which ends otelhttp's span.
func do(t *testing.T, ctx context.Context, rt http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

func clientSpans(r *rig) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	return out
}

func spanNamed(t *testing.T, r *rig, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range r.rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no span %q", name)
	return nil
}

func attr(attrs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, a := range attrs {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// resendCount is a span's http.request.resend_count, -1 when absent.
func resendCount(s sdktrace.ReadOnlySpan) int64 {
	v, ok := attr(s.Attributes(), semconv.HTTPRequestResendCountKey)
	if !ok {
		return -1
	}
	return v.AsInt64()
}

// Otelhttp as the base: one client span per attempt, children of the
// caller's span, the retries marked with their resend count and the first
// try not at all; the caller's span gets the retry events.
func TestBaseSpansCarryResendCount(t *testing.T) {
	r := newRig(t)
	srv, n := script(t, 502, 502, 200)
	tr := r.transport(nil)

	ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
	resp, err := do(t, ctx, tr, srv.URL+"/items?token=secret")
	caller.End()
	if err != nil || resp.StatusCode != 200 || n.Load() != 3 {
		t.Fatalf("got %v, %v after %d requests; want 200 after 3", resp, err, n.Load())
	}

	spans := clientSpans(r)
	if len(spans) != 3 {
		t.Fatalf("%d client spans, want 3", len(spans))
	}
	for i, s := range spans {
		want := int64(i)
		if i == 0 {
			want = -1 // only a request that was retried has the attribute
		}
		if got := resendCount(s); got != want {
			t.Errorf("span %d: resend_count %d, want %d (-1: absent)", i, got, want)
		}
		if s.Parent().SpanID() != caller.SpanContext().SpanID() {
			t.Errorf("span %d: parent %v, want the caller's span", i, s.Parent().SpanID())
		}
	}
	events := spanNamed(t, r, "caller").Events()
	if len(events) != 2 || events[0].Name != EventRetry {
		t.Fatalf("caller's events %v, want two %s", events, EventRetry)
	}
}

// Otelhttp around retryhttp: one client span, with an event per retry
// (attempt, status, wait), and a give-up event with its reason when the
// attempts run out.
func TestOuterSpanEvents(t *testing.T) {
	r := newRig(t, WithAttemptSpans(false))
	srv, _ := script(t, 502, 502, 200)
	tr := otelhttp.NewTransport(r.transport(nil), otelhttp.WithTracerProvider(r.tp))

	if _, err := do(t, context.Background(), tr, srv.URL+"/a"); err != nil {
		t.Fatal(err)
	}
	spans := clientSpans(r)
	if len(spans) != 1 {
		t.Fatalf("%d client spans, want 1: the attempts have none", len(spans))
	}
	events := spans[0].Events()
	if len(events) != 2 {
		t.Fatalf("%d events, want 2: %v", len(events), events)
	}
	for i, ev := range events {
		if ev.Name != EventRetry {
			t.Errorf("event %d named %q, want %q", i, ev.Name, EventRetry)
		}
		if v, _ := attr(ev.Attributes, AttemptKey); v.AsInt64() != int64(i+1) {
			t.Errorf("event %d: attempt %d, want %d", i, v.AsInt64(), i+1)
		}
		if v, _ := attr(ev.Attributes, semconv.HTTPResponseStatusCodeKey); v.AsInt64() != 502 {
			t.Errorf("event %d: status %d, want 502", i, v.AsInt64())
		}
		if v, ok := attr(ev.Attributes, WaitKey); !ok || v.AsFloat64() <= 0 || v.AsFloat64() > 1 {
			t.Errorf("event %d: wait %v (present %v), want a few milliseconds", i, v.AsFloat64(), ok)
		}
	}

	// The attempts run out: a retry, then the give-up with its reason.
	srv2, _ := script(t, 503)
	tr2 := otelhttp.NewTransport(r.transport(nil, retryhttp.WithMaxAttempts(2), retryhttp.WithLearning(false)),
		otelhttp.WithTracerProvider(r.tp))
	if resp, err := do(t, context.Background(), tr2, srv2.URL+"/b"); err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v; want the 503 back", resp, err)
	}
	spans = clientSpans(r)
	events = spans[len(spans)-1].Events()
	var names []string
	for _, ev := range events {
		names = append(names, ev.Name)
	}
	if !slices.Equal(names, []string{EventRetry, EventGiveUp}) {
		t.Fatalf("events %v, want a retry and a give-up", names)
	}
	gu := events[1].Attributes
	if v, _ := attr(gu, ReasonKey); v.AsString() != string(retryhttp.ReasonAttempts) {
		t.Errorf("give-up reason %q, want %q", v.AsString(), retryhttp.ReasonAttempts)
	}
	if v, _ := attr(gu, AttemptKey); v.AsInt64() != 2 {
		t.Errorf("give-up attempt %d, want 2", v.AsInt64())
	}
	if v, _ := attr(gu, semconv.HTTPResponseStatusCodeKey); v.AsInt64() != 503 {
		t.Errorf("give-up status %d, want 503", v.AsInt64())
	}
}

// Both arrangements at once: the outer span has the events, and the
// attempt spans are its children.
func TestOuterAndBaseSpans(t *testing.T) {
	r := newRig(t)
	srv, _ := script(t, 502, 200)
	tr := otelhttp.NewTransport(r.transport(nil), otelhttp.WithTracerProvider(r.tp))

	if _, err := do(t, context.Background(), tr, srv.URL+"/a"); err != nil {
		t.Fatal(err)
	}
	spans := clientSpans(r)
	if len(spans) != 3 {
		t.Fatalf("%d client spans, want the outer one and two attempts", len(spans))
	}
	outer := spans[0]
	if len(outer.Events()) != 1 || outer.Events()[0].Name != EventRetry {
		t.Errorf("outer events %v, want one retry", outer.Events())
	}
	if got := resendCount(outer); got != -1 {
		t.Errorf("outer span has resend_count %d; it is not an attempt", got)
	}
	for i, s := range spans[1:] {
		if s.Parent().SpanID() != outer.SpanContext().SpanID() {
			t.Errorf("attempt %d is not a child of the outer span", i+1)
		}
		if want := []int64{-1, 1}[i]; resendCount(s) != want {
			t.Errorf("attempt %d: resend_count %d, want %d", i+1, resendCount(s), want)
		}
	}
}

// A request that otelhttp's filter leaves without a span of its own is
// not marked: the span in its context is the caller's.
func TestFilteredAttemptLeavesCallerSpan(t *testing.T) {
	r := newRig(t, WithHTTPOptions(otelhttp.WithFilter(func(*http.Request) bool { return false })))
	srv, _ := script(t, 502, 200)
	tr := r.transport(nil)

	ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
	if _, err := do(t, ctx, tr, srv.URL+"/a"); err != nil {
		t.Fatal(err)
	}
	caller.End()
	if spans := clientSpans(r); len(spans) != 0 {
		t.Fatalf("%d client spans, want none: the filter refused them", len(spans))
	}
	if got := resendCount(spanNamed(t, r, "caller")); got != -1 {
		t.Errorf("caller's span got resend_count %d", got)
	}
}

// A try that got no response: the event has the error's type and its
// text, without the URL's query.
func TestErrorEvents(t *testing.T) {
	r := newRig(t, WithAttemptSpans(false))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // connection refused from now on

	tr := r.transport(nil, retryhttp.WithMaxAttempts(2))
	ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
	if _, err := do(t, ctx, tr, "http://"+addr+"/x?token=secret"); err == nil {
		t.Fatal("no error from a closed port")
	}
	caller.End()
	events := spanNamed(t, r, "caller").Events()
	if len(events) != 2 || events[0].Name != EventRetry || events[1].Name != EventGiveUp {
		t.Fatalf("events %v, want a retry and a give-up", events)
	}
	for _, ev := range events {
		et, _ := attr(ev.Attributes, semconv.ErrorTypeKey)
		msg, _ := attr(ev.Attributes, ErrorKey)
		if et.AsString() == "" || !strings.Contains(msg.AsString(), "refused") {
			t.Errorf("%s: error.type %q, error %q; want both", ev.Name, et.AsString(), msg.AsString())
		}
		if strings.Contains(msg.AsString(), "secret") {
			t.Errorf("%s: error text shows the query: %q", ev.Name, msg.AsString())
		}
		if _, ok := attr(ev.Attributes, semconv.HTTPResponseStatusCodeKey); ok {
			t.Errorf("%s: a status on a try that got none", ev.Name)
		}
	}
}

// point is a data point of a counter: its attributes and value.
type point struct {
	attrs attribute.Set
	value int64
}

func sums(t *testing.T, rm metricdata.ResourceMetrics, name string) []point {
	t.Helper()
	var out []point
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			s, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !s.IsMonotonic {
				t.Fatalf("%s is %T, want a monotonic int64 sum", name, m.Data)
			}
			for _, dp := range s.DataPoints {
				out = append(out, point{dp.Attributes, dp.Value})
			}
		}
	}
	return out
}

// total adds up the points whose attributes have every pair of want.
func total(points []point, want ...attribute.KeyValue) int64 {
	var n int64
	for _, p := range points {
		match := true
		for _, kv := range want {
			if v, ok := p.attrs.Value(kv.Key); !ok || v != kv.Value {
				match = false
			}
		}
		if match {
			n += p.value
		}
	}
	return n
}

func hostAttrs(t *testing.T, srv *httptest.Server) []attribute.KeyValue {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	return []attribute.KeyValue{semconv.ServerAddress(u.Hostname()), semconv.ServerPort(port)}
}

// noURLs fails the test if a metric of this package has an attribute
// value that is a URL, a path or a query: metrics are by host.
func noURLs(t *testing.T, rm metricdata.ResourceMetrics) {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			}
			for _, s := range sets {
				for _, kv := range s.ToSlice() {
					v := kv.Value.String()
					if strings.Contains(v, "://") || strings.Contains(v, "/p") || strings.Contains(v, "secret") {
						t.Errorf("%s: attribute %s = %q names more than a host", m.Name, kv.Key, v)
					}
				}
			}
		}
	}
}

// The counters: attempts by outcome, retries, refusals by reason, parkings,
// each by host, never by URL.
func TestMetrics(t *testing.T) {
	r := newRig(t)
	ok, _ := script(t, 502, 502, 200)
	spent, _ := script(t, 502)
	parks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(parks.Close)
	// A Retry-After of 1 s beyond the max of 100 ms: handed back at once,
	// and the host parked.
	tr := r.transport(nil, retryhttp.WithRetryAfterLimits(10*time.Millisecond, 100*time.Millisecond))

	start := time.Now()
	ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
	for _, u := range []string{ok.URL + "/p/1?token=secret", spent.URL + "/p/2", parks.URL + "/p/3"} {
		if _, err := do(t, ctx, tr, u); err != nil {
			t.Fatal(err)
		}
	}
	caller.End()
	rm := r.collect(t)
	noURLs(t, rm)

	okHost, spentHost, parksHost := hostAttrs(t, ok), hostAttrs(t, spent), hostAttrs(t, parks)
	get := semconv.HTTPRequestMethodKey.String("GET")
	attempts := sums(t, rm, "retryhttp.client.attempts")
	checks := []struct {
		what string
		got  int64
		want int64
	}{
		{"attempts to ok", total(attempts, okHost...), 3},
		{"attempts to ok, 502", total(attempts, append(okHost, semconv.HTTPResponseStatusCode(502))...), 2},
		{"attempts to ok, 200, GET", total(attempts, append(okHost, get, semconv.HTTPResponseStatusCode(200))...), 1},
		{"attempts to spent", total(attempts, spentHost...), 3},
		{"attempts to parks", total(attempts, parksHost...), 1},
		{"retries to ok", total(sums(t, rm, "retryhttp.client.retries"), append(okHost, semconv.HTTPResponseStatusCode(502))...), 2},
		{"retries to spent", total(sums(t, rm, "retryhttp.client.retries"), spentHost...), 2},
		{"refusals to ok", total(sums(t, rm, "retryhttp.client.refusals"), okHost...), 0},
		{"refusals to spent, out of attempts", total(sums(t, rm, "retryhttp.client.refusals"),
			append(spentHost, ReasonKey.String(string(retryhttp.ReasonAttempts)))...), 1},
		{"refusals to parks, server wait", total(sums(t, rm, "retryhttp.client.refusals"),
			append(parksHost, ReasonKey.String(string(retryhttp.ReasonServerWait)), semconv.HTTPResponseStatusCode(429))...), 1},
		{"parkings of parks", total(sums(t, rm, "retryhttp.client.parkings"), append(parksHost, semconv.HTTPResponseStatusCode(429))...), 1},
		{"parkings in all", total(sums(t, rm, "retryhttp.client.parkings")), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}

	// The parking is told on the caller's span too, with its host and end.
	var park *sdktrace.Event
	for _, ev := range spanNamed(t, r, "caller").Events() {
		if ev.Name == EventPark {
			park = &ev
		}
	}
	if park == nil {
		t.Fatal("no park event on the caller's span")
	}
	addr, _ := attr(park.Attributes, semconv.ServerAddressKey)
	until, _ := attr(park.Attributes, UntilKey)
	end, err := time.Parse(time.RFC3339Nano, until.AsString())
	// Parked for the Retry-After's 1 s from the answer, which came between
	// start and now.
	if addr.AsString() != "127.0.0.1" || err != nil || end.Before(start.Add(time.Second)) || end.After(time.Now().Add(time.Second)) {
		t.Errorf("park event at %q until %q (%v), want 127.0.0.1 for about 1 s", addr.AsString(), until.AsString(), err)
	}
}

func gauge(t *testing.T, rm metricdata.ResourceMetrics) []metricdata.DataPoint[float64] {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "retryhttp.client.host.pace" {
				return m.Data.(metricdata.Gauge[float64]).DataPoints
			}
		}
	}
	return nil
}

// The pace gauge reports the pace the Transport learned from a host that
// announced its quota, by host, and nothing for a host that is not paced;
// unregistered, it reports nothing.
func TestPaceGauge(t *testing.T) {
	r := newRig(t)
	quota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-RateLimit-Limit", "10")
		w.Header().Set("X-RateLimit-Remaining", "9")
		w.Header().Set("X-RateLimit-Reset", "1") // a delay: 10 a second
	}))
	t.Cleanup(quota.Close)
	free, _ := script(t, 200)
	tr := r.transport(nil)
	reg, err := r.inst.Observe(tr)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{quota.URL + "/p?token=secret", free.URL + "/p"} {
		if _, err := do(t, context.Background(), tr, u); err != nil {
			t.Fatal(err)
		}
	}

	rm := r.collect(t)
	noURLs(t, rm)
	points := gauge(t, rm)
	if len(points) != 1 {
		t.Fatalf("%d pace points, want 1, for the host with a quota: %v", len(points), points)
	}
	want := attribute.NewSet(hostAttrs(t, quota)...)
	if !points[0].Attributes.Equals(&want) || points[0].Value != 10 {
		t.Errorf("pace %v of %v, want 10 of %v", points[0].Value, points[0].Attributes.Encoded(attribute.DefaultEncoder()),
			want.Encoded(attribute.DefaultEncoder()))
	}

	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if points := gauge(t, r.collect(t)); len(points) != 0 {
		t.Errorf("%d pace points after Unregister, want none", len(points))
	}
	if _, err := r.inst.Observe(nil); err == nil {
		t.Error("Observe(nil) gave no error")
	}
}

// The host set keeps the most recently seen hosts, no more than its max.
func TestHostSetKeepsRecentHosts(t *testing.T) {
	s := newHostSet(2)
	a, b, c := host{"https", "a.example", 443}, host{"https", "b.example", 443}, host{"http", "c.example", 8080}
	s.see(a)
	s.see(b)
	s.see(a) // a is the most recent now: b goes first
	s.see(c)
	var got []string
	for _, e := range s.list() {
		got = append(got, e.target)
	}
	if want := []string{"http://c.example:8080", "https://a.example:443"}; !slices.Equal(got, want) {
		t.Errorf("hosts %v, want %v", got, want)
	}
	if v := s.see(host{"https", "::1", 8443}); len(v) != 2 || v[0].Value.AsString() != "::1" {
		t.Errorf("attributes of an IPv6 host: %v", v)
	}
	if got := (host{"https", "::1", 8443}).target(); got != "https://[::1]:8443" {
		t.Errorf("target %q", got)
	}
}

// One Instrumentation, many goroutines: go test -race keeps it honest.
func TestConcurrentUse(t *testing.T) {
	r := newRig(t, WithMaxHosts(2))
	var servers []*httptest.Server
	for range 3 {
		srv, _ := script(t, 502, 200)
		servers = append(servers, srv)
	}
	tr := r.transport(nil)
	reg, err := r.inst.Observe(tr)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			do(t, context.Background(), tr, servers[i%3].URL+"/p")
		})
		wg.Go(func() { r.collect(t) })
	}
	wg.Wait()
	if got := total(sums(t, r.collect(t), "retryhttp.client.attempts")); got != 15 {
		t.Errorf("%d attempts, want 15: 12 requests, 3 of them retried once", got)
	}
	if n := len(r.inst.hosts.list()); n != 2 {
		t.Errorf("%d hosts remembered, want WithMaxHosts's 2", n)
	}
}

type idleCloser struct {
	http.RoundTripper
	closed atomic.Bool
}

func (c *idleCloser) CloseIdleConnections() { c.closed.Store(true) }

// The Transport's CloseIdleConnections reaches the base given to Base,
// through otelhttp, which has no such method.
func TestCloseIdleConnectionsReachesBase(t *testing.T) {
	r := newRig(t)
	next := &idleCloser{RoundTripper: http.DefaultTransport}
	r.transport(next).CloseIdleConnections()
	if !next.closed.Load() {
		t.Error("CloseIdleConnections did not reach the base")
	}
}

// A hedge is counted as one, and told on the caller's span, with the
// attempt it hedged and how long that had waited; its attempt's span
// carries resend count 1.
func TestHedges(t *testing.T) {
	r := newRig(t)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if n.Add(1) == 1 {
			select { // the first try hangs until the hedge wins
			case <-req.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	tr := r.transport(nil, retryhttp.WithHedging(20*time.Millisecond))
	ctx, caller := r.tp.Tracer("test").Start(context.Background(), "caller")
	resp, err := do(t, ctx, tr, srv.URL+"/h")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	caller.End()
	rm := r.collect(t)
	if got := total(sums(t, rm, "retryhttp.client.hedges"), hostAttrs(t, srv)...); got != 1 {
		t.Errorf("%d hedges counted, want 1", got)
	}
	var events []string
	for _, s := range r.rec.Ended() {
		if s.Name() != "caller" {
			continue
		}
		for _, e := range s.Events() {
			if e.Name == EventHedge {
				a, _ := attr(e.Attributes, AttemptKey)
				w, _ := attr(e.Attributes, WaitKey)
				events = append(events, fmt.Sprintf("attempt %d after %.3fs", a.AsInt64(), w.AsFloat64()))
			}
		}
	}
	if len(events) != 1 || events[0] != "attempt 1 after 0.020s" {
		t.Errorf("hedge events on the caller's span: %v", events)
	}
}
