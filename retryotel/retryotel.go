// Package retryotel reports what retryhttp Transports do to OpenTelemetry:
// the resend count on the span of each attempt, an event on the caller's
// span for each retry, refused retry and parking, and metrics of attempts,
// retries, refusals, parkings, each host's pace, and the hosts held by
// state.
//
// It is a module of its own so that the core keeps no OpenTelemetry
// dependency. One Instrumentation serves one Transport:
//
//	inst := retryotel.New()
//	opts := append(inst.Options(), retryhttp.WithBase(inst.Base(nil)))
//	tr := retryhttp.New(opts...)
//	reg, err := inst.Observe(tr) // the gauges; reg.Unregister() when done
//	client := &http.Client{Transport: otelhttp.NewTransport(tr)} // optional outer span
//
// Metric attributes name hosts (server.address, server.port), never URLs
// or paths, so a client that talks to many URLs of few hosts keeps few
// series.
package retryotel

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/retryhttp/retryhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the metrics: the import path.
const ScopeName = "github.com/retryhttp/retryhttp/retryotel"

// The names of the span events; see the README for their attributes.
const (
	EventRetry  = "retryhttp.retry"   // a failed try, and the retry that follows
	EventGiveUp = "retryhttp.give_up" // a failed try worth a retry, handed back
	EventPark   = "retryhttp.park"    // an answer that parked its host
	EventHedge  = "retryhttp.hedge"   // a hedge, sent beside a first try that had not answered
)

// The attribute keys of this package; the others are the semantic
// conventions' (server.address, server.port, http.request.method,
// http.response.status_code, error.type, http.request.resend_count).
const (
	AttemptKey = attribute.Key("retryhttp.attempt")    // the try that failed, 1 for the first
	WaitKey    = attribute.Key("retryhttp.wait")       // seconds waited before the retry was sent
	ReasonKey  = attribute.Key("retryhttp.reason")     // a retryhttp.Reason: why a retry was refused
	ErrorKey   = attribute.Key("retryhttp.error")      // the error's text, without a URL
	UntilKey   = attribute.Key("retryhttp.until")      // when a parking ends, RFC 3339 in UTC
	StateKey   = attribute.Key("retryhttp.host.state") // a retryhttp.HostState's name: healthy, failing, overloaded, down, recovering
)

// hostStates is how many states the host gauge reports: retryhttp's
// HostHealthy to HostRecovering, numbered from 0.
const hostStates = int(retryhttp.HostRecovering) + 1

// DefaultMaxHosts is how many hosts an Instrumentation remembers for the
// pace gauge when WithMaxHosts does not say.
const DefaultMaxHosts = 256

// Instrumentation reports one retryhttp Transport to OpenTelemetry: give
// its Options and its Base to retryhttp.New, and the Transport to Observe.
// Make one with New; it is safe for concurrent use and starts no goroutine.
type Instrumentation struct {
	httpOpts []otelhttp.Option
	spans    bool
	hosts    *hostSet

	attempts metric.Int64Counter
	retries  metric.Int64Counter
	hedges   metric.Int64Counter
	refusals metric.Int64Counter
	parkings metric.Int64Counter
	pace     metric.Float64ObservableGauge
	held     metric.Int64ObservableGauge      // hosts held, by state
	parked   metric.Int64ObservableGauge      // hosts parked
	states   [hostStates]metric.ObserveOption // each state's attribute, made once
	meter    metric.Meter
}

type config struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	httpOpts []otelhttp.Option
	noSpans  bool
	maxHosts int
}

// Option configures an Instrumentation.
type Option func(*config)

// WithTracerProvider sets the TracerProvider of the attempt spans that Base
// starts. nil, the default, leaves otelhttp's choice: the provider of the
// span in the request's context, else the global one. The events need no
// provider: they go on the span already in the caller's context.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the MeterProvider of the metrics, this package's
// and those of the otelhttp.Transport in Base. nil, the default, means the
// global one, otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithHTTPOptions adds options for the otelhttp.Transport that Base puts
// around each attempt: a span name formatter, propagators, filters. They
// are applied after the providers of WithTracerProvider and
// WithMeterProvider, so they can override them. None by default.
func WithHTTPOptions(opts ...otelhttp.Option) Option {
	return func(c *config) { c.httpOpts = append(c.httpOpts, opts...) }
}

// WithAttemptSpans says whether Base starts a client span for each attempt
// (through otelhttp). On by default; off, Base only counts the attempts and
// notes their hosts, for a client that wants one span per request, from an
// otelhttp.Transport around the retryhttp Transport.
func WithAttemptSpans(on bool) Option {
	return func(c *config) { c.noSpans = !on }
}

// WithMaxHosts sets how many hosts, the most recently seen, the pace gauge
// reports on: a crawler of a million hosts keeps at most n series and n
// HostPace calls per collection. n < 1 means DefaultMaxHosts (256).
func WithMaxHosts(n int) Option {
	return func(c *config) { c.maxHosts = n }
}

// New returns an Instrumentation configured by opts; without options it
// reports to the global MeterProvider and starts attempt spans with
// otelhttp's default TracerProvider. Its instruments are made at once: an
// error making one, which the SDK does not give for these names, goes to
// otel.Handle, as otelhttp's do, rather than failing the client.
func New(opts ...Option) *Instrumentation {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.maxHosts < 1 {
		c.maxHosts = DefaultMaxHosts
	}
	i := &Instrumentation{spans: !c.noSpans, hosts: newHostSet(c.maxHosts)}
	if c.tp != nil {
		i.httpOpts = append(i.httpOpts, otelhttp.WithTracerProvider(c.tp))
	}
	i.httpOpts = append(i.httpOpts, otelhttp.WithMeterProvider(c.mp))
	i.httpOpts = append(i.httpOpts, c.httpOpts...)

	i.meter = c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var errs error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := i.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = errors.Join(errs, err)
		return c
	}
	i.attempts = counter("retryhttp.client.attempts", "{attempt}",
		"Tries sent to the base, first tries and retries, by host and outcome.")
	i.retries = counter("retryhttp.client.retries", "{retry}",
		"Retries sent, by host and the outcome of the try that failed.")
	i.hedges = counter("retryhttp.client.hedges", "{hedge}",
		"Hedges sent beside a first try that had not answered (retryhttp.WithHedging), by host and method.")
	i.refusals = counter("retryhttp.client.refusals", "{refusal}",
		"Failed tries worth a retry that were handed back instead, by host and retryhttp.reason.")
	i.parkings = counter("retryhttp.client.parkings", "{parking}",
		"Answers that parked their host (Retry-After, or a spent quota with its reset).")
	var err error
	i.pace, err = i.meter.Float64ObservableGauge("retryhttp.client.host.pace", metric.WithUnit("{request}/s"),
		metric.WithDescription("The pace in force for a recently seen host that is paced, configured or learned."))
	errs = errors.Join(errs, err)
	i.held, err = i.meter.Int64ObservableGauge("retryhttp.client.hosts", metric.WithUnit("{host}"),
		metric.WithDescription("The hosts the Transport holds a record of, by retryhttp.host.state (Transport.Hosts)."))
	errs = errors.Join(errs, err)
	i.parked, err = i.meter.Int64ObservableGauge("retryhttp.client.hosts.parked", metric.WithUnit("{host}"),
		metric.WithDescription("The hosts parked: every request to them waits, or fails fast, until a moment a server named."))
	errs = errors.Join(errs, err)
	for s := range hostStates {
		i.states[s] = metric.WithAttributeSet(attribute.NewSet(StateKey.String(retryhttp.HostState(s).String())))
	}
	if errs != nil {
		otel.Handle(errs)
	}
	return i
}

// Options returns the retryhttp options that report retries, refused
// retries and parkings: hooks (retryhttp.WithOnRetry, WithOnGiveUp,
// WithOnPark) that add to the Transport's other hooks. Each adds an event
// to the span of the caller's request context, when it records (an
// otelhttp.Transport's around the retryhttp Transport, else the caller's
// own), and counts in the metrics.
func (i *Instrumentation) Options() []retryhttp.Option {
	return []retryhttp.Option{
		retryhttp.WithOnRetry(i.onRetry),
		retryhttp.WithOnGiveUp(i.onGiveUp),
		retryhttp.WithOnPark(i.onPark),
	}
}

func (i *Instrumentation) onRetry(ev retryhttp.RetryEvent) {
	if ev.Hedge {
		i.hedged(ev)
		return
	}
	// The wait is no metric attribute: its values have no bound.
	i.failed(ev, i.retries, EventRetry, WaitKey.Float64(ev.Delay.Seconds()), false)
}

// hedged reports a hedge: counted by host and method, and told on the
// caller's span with the attempt it hedged and how long that had waited.
func (i *Instrumentation) hedged(ev retryhttp.RetryEvent) {
	req := ev.Request
	ctx := req.Context()
	attrs := append(i.hosts.see(hostOf(req.URL)), methodAttr(req))
	i.hedges.Add(ctx, 1, metric.WithAttributes(attrs...))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(EventHedge, trace.WithAttributes(AttemptKey.Int(ev.Attempt), WaitKey.Float64(ev.Delay.Seconds())))
	}
}

func (i *Instrumentation) onGiveUp(ev retryhttp.RetryEvent) {
	i.failed(ev, i.refusals, EventGiveUp, ReasonKey.String(string(ev.Reason)), true)
}

// failed reports a failed try worth a retry: counted by host, method and
// outcome (and detail, when counted), and told on the caller's span with
// the attempt, the outcome and detail (the wait, or the reason).
func (i *Instrumentation) failed(ev retryhttp.RetryEvent, c metric.Int64Counter, event string, detail attribute.KeyValue, counted bool) {
	req := ev.Request
	ctx := req.Context()
	outcome := outcomeAttr(ev.Status, ev.Err)
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, i.hosts.see(hostOf(req.URL))...)
	attrs = append(attrs, methodAttr(req), outcome)
	if counted {
		attrs = append(attrs, detail)
	}
	c.Add(ctx, 1, metric.WithAttributes(attrs...))

	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	ea := make([]attribute.KeyValue, 0, 4)
	ea = append(ea, AttemptKey.Int(ev.Attempt), outcome)
	if ev.Err != nil {
		ea = append(ea, ErrorKey.String(errorText(ev.Err)))
	}
	ea = append(ea, detail)
	span.AddEvent(event, trace.WithAttributes(ea...))
}

func (i *Instrumentation) onPark(ev retryhttp.ParkEvent) {
	req := ev.Request
	ctx := req.Context()
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, i.hosts.see(hostOf(req.URL))...)
	attrs = append(attrs, semconv.HTTPResponseStatusCode(ev.Status))
	i.parkings.Add(ctx, 1, metric.WithAttributes(attrs...))

	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(EventPark, trace.WithAttributes(append(attrs,
			UntilKey.String(ev.Until.UTC().Format(time.RFC3339Nano)))...))
	}
}

// Observe makes the gauges report t at each collection, until the
// returned Registration is unregistered:
//
//   - retryhttp.client.host.pace, t's pace (Transport.HostPace) for each
//     paced host among the most recent that this Instrumentation saw. A
//     host is seen by Base on every attempt, and by the hooks of Options;
//     unpaced hosts are not reported. With a shared Limiter (redislimit),
//     each host costs a call to it per collection;
//   - retryhttp.client.hosts, how many hosts t holds a record of in each
//     state (Transport.Hosts; every state reported, 0 included), and
//     retryhttp.client.hosts.parked, how many of them are parked. They
//     range over t's records once per collection, one shard's lock at a
//     time, and cost nothing on the path of a request.
func (i *Instrumentation) Observe(t *retryhttp.Transport) (metric.Registration, error) {
	if t == nil {
		return nil, errors.New("retryotel: Observe of a nil Transport")
	}
	return i.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		i.observeHosts(t, o)
		var first error
		failed := 0
		for _, h := range i.hosts.list() {
			p, err := t.HostPace(ctx, h.target)
			if err != nil {
				// HostPace still gives the configured pace: report it.
				failed++
				if first == nil {
					first = err
				}
			}
			if !p.Unlimited() {
				o.ObserveFloat64(i.pace, float64(p.Limit), metric.WithAttributes(h.attrs...))
			}
		}
		if first != nil {
			return errors.New("retryotel: pace of " + strconv.Itoa(failed) + " hosts unknown: " + first.Error())
		}
		return nil
	}, i.pace, i.held, i.parked)
}

// observeHosts counts t's records by state, and those parked.
func (i *Instrumentation) observeHosts(t *retryhttp.Transport, o metric.Observer) {
	var n [hostStates]int64
	var parked int64
	for st := range t.Hosts() {
		if int(st.State) < len(n) {
			n[st.State]++
		}
		if !st.ParkedUntil.IsZero() { // set only while parked
			parked++
		}
	}
	for s := range hostStates {
		o.ObserveInt64(i.held, n[s], i.states[s])
	}
	o.ObserveInt64(i.parked, parked)
}

// host is a host as the metrics name it: a map key.
type host struct {
	scheme, name string
	port         int // 0 when neither the URL nor its scheme says
}

// hostOf is the host of u, lower case, with its port or its scheme's.
func hostOf(u *url.URL) host {
	if u == nil {
		return host{}
	}
	h := host{scheme: strings.ToLower(u.Scheme), name: strings.ToLower(u.Hostname())}
	if p, err := strconv.Atoi(u.Port()); err == nil {
		h.port = p
	} else {
		switch h.scheme {
		case "https":
			h.port = 443
		case "http":
			h.port = 80
		}
	}
	return h
}

// target is h as Transport.HostPace takes it: a URL, so that its default
// port is dropped as the Transport drops it.
func (h host) target() string {
	hp := h.name
	if strings.Contains(hp, ":") {
		hp = "[" + hp + "]"
	}
	if h.port != 0 {
		hp += ":" + strconv.Itoa(h.port)
	}
	return (&url.URL{Scheme: h.scheme, Host: hp}).String()
}

func (h host) attrs() []attribute.KeyValue {
	a := []attribute.KeyValue{semconv.ServerAddress(h.name)}
	if h.port != 0 {
		a = append(a, semconv.ServerPort(h.port))
	}
	return a[:len(a):len(a)] // shared: an append must copy
}

// methodAttr is the request's method as the conventions want it: the
// known methods as they are, any other as _OTHER, so that a client cannot
// make series out of made-up methods.
func methodAttr(req *http.Request) attribute.KeyValue {
	switch m := req.Method; m {
	case "":
		return semconv.HTTPRequestMethodKey.String(http.MethodGet)
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return semconv.HTTPRequestMethodKey.String(m)
	}
	return semconv.HTTPRequestMethodOther
}

// outcomeAttr is a try's status, or the type of its error.
func outcomeAttr(status int, err error) attribute.KeyValue {
	if err != nil || status == 0 {
		return semconv.ErrorType(err)
	}
	return semconv.HTTPResponseStatusCode(status)
}

// errorText is an error's text without the URL that a *url.Error adds,
// which may carry a query or a password; the core's RetryError redacts the
// same way.
func errorText(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err.Error()
	}
	inner := ue.Op + ": " + errorText(ue.Err)
	if ue == err {
		return inner
	}
	return strings.Replace(err.Error(), ue.Error(), inner, 1)
}
