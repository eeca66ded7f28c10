package retryotel

import (
	"context"
	"net/http"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/retryhttp/retryhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Base returns the RoundTripper to give retryhttp.WithBase: every attempt
// the Transport makes goes through it. It counts each attempt
// (retryhttp.client.attempts), notes its host for the pace gauge, and,
// unless WithAttemptSpans(false), sends it through an otelhttp.Transport,
// so each attempt has a client span of its own, a child of the span in the
// caller's context, and a retry's span carries http.request.resend_count
// (1 for the first retry; absent on a first try, as the conventions ask).
// nil next means retryhttp's default base,
// cleanhttp.DefaultPooledTransport(). The result's CloseIdleConnections
// reaches next.
func (i *Instrumentation) Base(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = cleanhttp.DefaultPooledTransport()
	}
	b := &base{i: i, next: next, closer: next}
	if i.spans {
		b.next = otelhttp.NewTransport(resendMarker{next}, i.httpOpts...)
		b.mark = true
	}
	return b
}

// base is the layer above otelhttp: it sees every attempt, and tells the
// layer below which span was the caller's.
type base struct {
	i      *Instrumentation
	next   http.RoundTripper
	closer http.RoundTripper // next before otelhttp, which has no CloseIdleConnections
	mark   bool
}

// callerSpanKey is the context key of the caller's span context, put on a
// retry's request for resendMarker.
type callerSpanKey struct{}

func (b *base) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, b.i.hosts.see(hostOf(req.URL))...)
	attrs = append(attrs, methodAttr(req))
	if b.mark && retryhttp.ResendCount(ctx) > 0 {
		// otelhttp passes its filtered requests on without a span of its
		// own: the span resendMarker finds is then the caller's, which
		// must not be marked as a resend.
		req = req.WithContext(context.WithValue(ctx, callerSpanKey{}, trace.SpanContextFromContext(ctx)))
	}
	resp, err := b.next.RoundTrip(req)
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	attrs = append(attrs, outcomeAttr(status, err))
	b.i.attempts.Add(ctx, 1, metric.WithAttributes(attrs...))
	return resp, err
}

// CloseIdleConnections closes the idle connections of the RoundTripper
// given to Base, if it can.
func (b *base) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := b.closer.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
}

// resendMarker is the layer below otelhttp: the span in its request's
// context is the one otelhttp started for this attempt, still open, so the
// attribute lands on it. otelhttp has no hook that sets a span attribute
// per request, and a layer above it would start before the span does.
type resendMarker struct{ next http.RoundTripper }

func (m resendMarker) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if n := retryhttp.ResendCount(ctx); n > 0 {
		if caller, ok := ctx.Value(callerSpanKey{}).(trace.SpanContext); ok {
			span := trace.SpanFromContext(ctx)
			if sc := span.SpanContext(); sc.IsValid() && !sc.Equal(caller) {
				span.SetAttributes(semconv.HTTPRequestResendCount(n))
			}
		}
	}
	return m.next.RoundTrip(req)
}
