package retryotel_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"time"

	"github.com/retryhttp/retryhttp"
	"github.com/retryhttp/retryhttp/retryotel"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Both arrangements at once: otelhttp around the retryhttp Transport makes
// one span for the request, with an event per retry, and Base makes one
// span per attempt, a retry's with its resend count.
func Example() {
	// A host that fails twice, then answers.
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) <= 2 {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	rec := tracetest.NewSpanRecorder() // in a program: an exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))

	inst := retryotel.New(retryotel.WithTracerProvider(tp)) // the global MeterProvider
	tr := retryhttp.New(append(inst.Options(),
		retryhttp.WithBase(inst.Base(nil)), // nil: retryhttp's default base
		retryhttp.WithBackoff(time.Millisecond, 2*time.Millisecond))...)
	reg, err := inst.Observe(tr) // the pace and host gauges
	if err != nil {
		panic(err)
	}
	defer reg.Unregister()
	client := &http.Client{Transport: otelhttp.NewTransport(tr, otelhttp.WithTracerProvider(tp))}

	resp, err := client.Get(srv.URL + "/items")
	if err != nil {
		panic(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // ends the spans
	tp.Shutdown(context.Background())

	spans := rec.Ended()
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	for _, s := range spans {
		line := s.Name()
		for _, a := range s.Attributes() {
			if a.Key == semconv.HTTPRequestResendCountKey || a.Key == semconv.HTTPResponseStatusCodeKey {
				line += fmt.Sprintf(" %s=%v", a.Key, a.Value.String())
			}
		}
		for _, ev := range s.Events() {
			line += " [" + ev.Name + "]"
		}
		fmt.Println(line)
	}
	// Output:
	// HTTP GET http.response.status_code=200 [retryhttp.retry] [retryhttp.retry]
	// HTTP GET http.response.status_code=502
	// HTTP GET http.request.resend_count=1 http.response.status_code=502
	// HTTP GET http.request.resend_count=2 http.response.status_code=200
}
