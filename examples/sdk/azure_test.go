package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	azruntime "github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/retryhttp/retryhttp"
)

// The Azure tests drive the azcore pipeline the way a data-plane client's
// generated code does: a policy.Request, Pipeline.Do, and an
// *azcore.ResponseError for a status it did not expect.

func azureError(status int, code string, header ...string) reply {
	h := map[string]string{"Content-Type": "application/json", "x-ms-error-code": code}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return reply{status, h, `{"code": "` + code + `", "message": "stub says ` + http.StatusText(status) + `"}`}
}

var (
	azureOK      = reply{http.StatusOK, map[string]string{"Content-Type": "application/json"}, `{"id": "doc1"}`}
	azureCreated = reply{http.StatusCreated, map[string]string{"Content-Type": "application/json"}, `{"id": "doc1"}`}
)

// azureCall sends one request through pl as a data-plane client does, with
// body set as azcore sets it (a ReadSeekCloser), and returns the status or
// the *azcore.ResponseError of an answer it did not expect.
func azureCall(ctx context.Context, pl azruntime.Pipeline, method, url string, body []byte, ok ...int) (int, error) {
	req, err := azruntime.NewRequest(ctx, method, url)
	if err != nil {
		return 0, err
	}
	if body != nil {
		if err := req.SetBody(streaming.NopCloser(bytes.NewReader(body)), "application/octet-stream"); err != nil {
			return 0, err
		}
	}
	resp, err := pl.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if !azruntime.HasStatusCode(resp, ok...) {
		return resp.StatusCode, azruntime.NewResponseError(resp)
	}
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func checkAzureError(t *testing.T, err error, status int, code string) {
	t.Helper()
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != status || re.ErrorCode != code {
		t.Errorf("err = %v (%T), want an *azcore.ResponseError %d %s", err, err, status, code)
	}
}

// TestAzureWaitsNamed proves that the waits Azure services name are
// obeyed: Cosmos DB's 429 with x-ms-retry-after-ms: 3000, and a 503 with
// retry-after-ms: 3000 beside Retry-After: 1 (Azure OpenAI), each wait 3 s
// (azcore's own retry policy reads them in the same order).
func TestAzureWaitsNamed(t *testing.T) {
	t.Parallel()
	for _, answer := range []reply{
		azureError(429, "TooManyRequests", "x-ms-retry-after-ms", "3000"),
		azureError(503, "ServiceUnavailable", "retry-after-ms", "3000", "Retry-After", "1"),
	} {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(answer, azureOK))
			start := time.Now()
			if _, err := azureCall(context.Background(), newAzurePipeline(fast(base)), http.MethodGet, url+"/dbs/db/colls/c/docs/doc1", nil, 200); err != nil {
				t.Fatal(err)
			}
			if hits := rec.Hits(); len(hits) != 2 || time.Since(start) != 3*time.Second {
				t.Errorf("after %d: the stub answered %s in %v, want 2 requests 3 s apart", answer.status, statuses(hits), time.Since(start))
			}
		})
	}
}

// TestAzureWaitHandedBack proves that a wait beyond 60 s comes back at once
// as the *azcore.ResponseError of the 429, and that the next call fails
// with ErrHostPaused without a request.
func TestAzureWaitHandedBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(azureError(429, "TooManyRequests", "x-ms-retry-after-ms", "120000")))
		pl := newAzurePipeline(fast(base))
		_, err := azureCall(context.Background(), pl, http.MethodGet, url+"/docs/doc1", nil, 200)
		checkAzureError(t, err, 429, "TooManyRequests")
		nextCallParked(t, rec, "call", func() error {
			_, err := azureCall(context.Background(), pl, http.MethodGet, url+"/docs/doc1", nil, 200)
			return err
		})
	})
}

// TestAzureMaxRetries proves how to turn azcore's retries off: MaxRetries
// -1. With MaxRetries 0, azcore's default of 3 retries applies, and a GET
// on a host that answers 503 every time costs 4 × 3 = 12 requests; with -1
// it costs retryhttp's 3.
func TestAzureMaxRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxRetries int32
		hits       int
	}{{-1, 3}, {0, 12}} {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(azureError(503, "ServiceUnavailable")))
			opts := azureOptions(layered(base))
			opts.Retry.MaxRetries = tc.maxRetries
			pl := azruntime.NewPipeline("retryhttp-example", "v0.0.0", azruntime.PipelineOptions{}, &opts)
			_, err := azureCall(context.Background(), pl, http.MethodGet, url+"/docs/doc1", nil, 200)
			checkAzureError(t, err, 503, "ServiceUnavailable")
			if hits := rec.Hits(); len(hits) != tc.hits {
				t.Errorf("MaxRetries %d: the stub saw %d requests, want %d", tc.maxRetries, len(hits), tc.hits)
			}
		})
	}
}

// TestAzureUpload proves that an upload (a PUT, as a blob or a block is
// put) of any size is asked again after a 500 with exactly the caller's
// bytes: azcore hands over a body with GetBody, so retryhttp copies
// nothing, and its replay limit does not apply.
func TestAzureUpload(t *testing.T) {
	t.Parallel()
	for _, size := range []int{64 << 10, 1 << 20} {
		rec, ts := loopbackStub(t, replies(azureError(500, "InternalError"), azureCreated))
		data := randomBytes(size)
		pl := newAzurePipeline(fast(nil))
		if _, err := azureCall(context.Background(), pl, http.MethodPut, ts.URL+"/container/blob", data, 201); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		hits := rec.Hits()
		if len(hits) != 2 {
			t.Fatalf("%d bytes: the stub answered %s, want [500 201]", size, statuses(hits))
		}
		for i, h := range hits {
			if sha256.Sum256(h.Body) != sha256.Sum256(data) {
				t.Errorf("%d bytes: attempt %d carried %d bytes that are not the caller's", size, i+1, len(h.Body))
			}
		}
	}
}

// TestAzurePost proves what changes when retryhttp retries instead of
// azcore, which resends any method: a POST answered 503 (an Azure OpenAI
// chat completion, a Cosmos DB query) is sent once and comes back as the
// *azcore.ResponseError, unless the client says which POSTs are safe to
// repeat (WithSafeToRepeat), when it is asked again.
func TestAzurePost(t *testing.T) {
	t.Parallel()
	queries := func(r *http.Request) bool {
		return r.Method == http.MethodPost && r.Header.Get("x-ms-documentdb-isquery") == "true"
	}
	for _, tc := range []struct {
		name string
		opts []retryhttp.Option
		hits int
	}{
		{"unsaid", nil, 1},
		{"WithSafeToRepeat", []retryhttp.Option{retryhttp.WithSafeToRepeat(queries)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(azureError(503, "ServiceUnavailable"), azureOK))
				pl := newAzurePipeline(fast(base, tc.opts...))
				req, _ := azruntime.NewRequest(context.Background(), http.MethodPost, url+"/dbs/db/colls/c/docs")
				req.Raw().Header.Set("x-ms-documentdb-isquery", "true")
				req.SetBody(streaming.NopCloser(bytes.NewReader([]byte(`{"query": "SELECT * FROM c"}`))), "application/query+json")
				resp, err := pl.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
				if tc.hits == 1 {
					checkAzureError(t, azruntime.NewResponseError(resp), 503, "ServiceUnavailable")
				}
			})
		})
	}
}

// azureSDKRetries is azureOptions with azcore's retries left as they are
// by default.
func azureSDKRetries(hc *http.Client) azruntime.Pipeline {
	return azruntime.NewPipeline("retryhttp-example", "v0.0.0", azruntime.PipelineOptions{},
		&policy.ClientOptions{Transport: hc})
}

// TestAzureSDKRetriesMultiply proves what leaving azcore's retry policy
// on costs: a 429 with x-ms-retry-after-ms: 1000 on every answer, 4 × 3 =
// 12 requests for one call.
func TestAzureSDKRetriesMultiply(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(azureError(429, "TooManyRequests", "x-ms-retry-after-ms", "1000")))
		_, err := azureCall(context.Background(), azureSDKRetries(fast(base)), http.MethodGet, url+"/docs/doc1", nil, 200)
		checkAzureError(t, err, 429, "TooManyRequests")
		if hits := rec.Hits(); len(hits) != 12 {
			t.Errorf("the stub saw %d requests, want 12", len(hits))
		}
	})
}
