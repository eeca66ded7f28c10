package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/minio/minio-go/v7"
	"github.com/retryhttp/retryhttp"
)

// s3Multipart is a stub of S3's multipart upload: it starts an upload,
// takes parts, completes and aborts, and remembers each part's payload
// (the aws-chunked encoding minio-go signs over http decoded). failPart
// answers the first try of that part number 503 SlowDown; completeError
// answers the first CompleteMultipartUpload 200 OK with an InternalError
// in the body, as S3 documents it may.
type s3Multipart struct {
	failPart      string
	completeError bool

	mu        sync.Mutex
	partTries map[string]int
	payloads  map[string][][]byte // per part number, per attempt
	completes int
	aborted   bool
}

func (s *s3Multipart) answer(_ int, r *http.Request, body []byte) reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := r.URL.Query()
	xml := map[string]string{"Content-Type": "application/xml"}
	switch {
	case r.Method == http.MethodPost && q.Has("uploads"):
		return reply{200, xml, `<InitiateMultipartUploadResult><Bucket>bucket</Bucket><Key>big.bin</Key><UploadId>u1</UploadId></InitiateMultipartUploadResult>`}
	case r.Method == http.MethodPut && q.Has("partNumber"):
		part := q.Get("partNumber")
		s.partTries[part]++
		payload, err := s3Payload(r.Header, body)
		if err != nil {
			return s3Error(400, "BadDigest")
		}
		s.payloads[part] = append(s.payloads[part], payload)
		if part == s.failPart && s.partTries[part] == 1 {
			return s3Error(503, "SlowDown")
		}
		return reply{200, map[string]string{"ETag": fmt.Sprintf(`"etag-%s"`, part)}, ""}
	case r.Method == http.MethodPost && q.Has("uploadId"):
		s.completes++
		if s.completeError && s.completes == 1 {
			return reply{200, xml, `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
				`<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message><RequestId>R</RequestId><HostId>H</HostId></Error>`}
		}
		return reply{200, xml, `<CompleteMultipartUploadResult><Location>http://stub/bucket/big.bin</Location><Bucket>bucket</Bucket><Key>big.bin</Key><ETag>"etag-2"</ETag></CompleteMultipartUploadResult>`}
	case r.Method == http.MethodDelete && q.Has("uploadId"):
		s.aborted = true
		return reply{204, nil, ""}
	}
	return s3Error(400, "InvalidRequest")
}

func newS3Multipart() *s3Multipart {
	return &s3Multipart{partTries: map[string]int{}, payloads: map[string][][]byte{}}
}

func minioAt(t *testing.T, endpoint string, opts ...retryhttp.Option) *minio.Client {
	t.Helper()
	c, err := newMinio(strings.TrimPrefix(endpoint, "http://"), fast(nil, opts...).Transport)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func minioCode(err error) string { return minio.ToErrorResponse(err).Code }

// TestMinioRetriesOff proves how to turn minio-go's retries off: MaxRetries
// 1. Left at 0, its default of 10 applies, and one GetObject on a host that
// answers 503 SlowDown every time costs 10 × 3 = 30 requests, against
// retryhttp's 3; the caller gets minio's ErrorResponse with the code.
func TestMinioRetriesOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxRetries, hits int
	}{{1, 3}, {0, 30}} {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(s3Slow))
			c, err := minio.New(strings.TrimPrefix(url, "http://"), &minio.Options{
				Creds: minioCreds, Region: "us-east-1", BucketLookup: minio.BucketLookupPath,
				Transport: layered(base).Transport, MaxRetries: tc.maxRetries,
			})
			if err != nil {
				t.Fatal(err)
			}
			obj, err := c.GetObject(context.Background(), "bucket", "key", minio.GetObjectOptions{})
			if err == nil {
				_, err = io.ReadAll(obj)
			}
			if minioCode(err) != "SlowDown" {
				t.Errorf("err = %v, want minio's SlowDown", err)
			}
			if hits := rec.Hits(); len(hits) != tc.hits {
				t.Errorf("MaxRetries %d: the stub saw %d requests, want %d", tc.maxRetries, len(hits), tc.hits)
			}
		})
	}
}

// TestMinioLargePart proves what happens to a multipart part that one
// SlowDown answers. minio-go hands each part over as io.NopCloser of its
// seekable reader: no GetBody, no Seek, so retryhttp can replay it only
// from a copy, up to WithReplayLimit. A 16 MiB part (minio's smallest for
// a known size) is above the default 256 KiB: it is sent once, and the
// SlowDown aborts the whole upload (retryhttp's reason: ReasonNoRewind).
// Over http minio-go signs the part in 64 KiB chunks, which adds 90 bytes
// to each: the 16 MiB part is 16,800,342 bytes on the wire, so
// WithReplayLimit(16 << 20) is not enough either. WithReplayLimit(17 << 20)
// lets the part be asked again with exactly its bytes, and the upload
// succeeds; so does a client that leaves retries to minio-go (MaxRetries 0)
// over retryhttp.New(retryhttp.WithMaxAttempts(1)), which keeps no copy:
// minio-go seeks its reader back.
func TestMinioLargePart(t *testing.T) {
	t.Parallel()
	data := randomBytes(16<<20 + 64<<10) // two parts: 16 MiB and 64 KiB
	for _, tc := range []struct {
		name  string
		limit int64
		sdk   bool // minio-go's retries on, retryhttp's off
		ok    bool
	}{
		{"default replay limit", 0, false, false},
		{"WithReplayLimit(16 << 20)", 16 << 20, false, false},
		{"WithReplayLimit(17 << 20)", 17 << 20, false, true},
		{"minio-go's retries over WithMaxAttempts(1)", 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newS3Multipart()
			s.failPart = "1"
			_, ts := loopbackStub(t, s.answer)
			var reasons []retryhttp.Reason
			var mu sync.Mutex
			giveUp := retryhttp.WithOnGiveUp(func(e retryhttp.RetryEvent) {
				mu.Lock()
				defer mu.Unlock()
				reasons = append(reasons, e.Reason)
			})
			c := minioAt(t, ts.URL, retryhttp.WithReplayLimit(tc.limit), giveUp)
			if tc.sdk {
				c = minioUploads(t, ts.URL)
			}
			_, err := c.PutObject(context.Background(), "bucket", "big.bin",
				bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{})
			s.mu.Lock()
			defer s.mu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			if !tc.ok {
				if minioCode(err) != "SlowDown" || s.partTries["1"] != 1 || !s.aborted || s.completes != 0 {
					t.Errorf("err %v, part 1 sent %d times, aborted %v, completed %d: want SlowDown after one try, the upload aborted",
						err, s.partTries["1"], s.aborted, s.completes)
				}
				if fmt.Sprint(reasons) != fmt.Sprint([]retryhttp.Reason{retryhttp.ReasonNoRewind}) {
					t.Errorf("reasons %q, want %q", reasons, retryhttp.ReasonNoRewind)
				}
				return
			}
			if err != nil || s.partTries["1"] != 2 || s.completes != 1 || s.aborted {
				t.Fatalf("err %v, part 1 sent %d times, completed %d: want it sent twice and the upload completed", err, s.partTries["1"], s.completes)
			}
			want := sha256.Sum256(data[:16<<20])
			for i, p := range s.payloads["1"] {
				if sha256.Sum256(p) != want {
					t.Errorf("attempt %d of part 1 carried %d bytes that are not the caller's", i+1, len(p))
				}
			}
		})
	}
}

// minioUploads is a client for large uploads that leaves the retries to
// minio-go, which seeks its part back for each try, and keeps retryhttp's
// pacing and parking with one try each (no copy of the body is kept).
func minioUploads(t *testing.T, endpoint string) *minio.Client {
	t.Helper()
	c, err := minio.New(strings.TrimPrefix(endpoint, "http://"), &minio.Options{
		Creds: minioCreds, Region: "us-east-1", BucketLookup: minio.BucketLookupPath,
		Transport: retryhttp.New(retryhttp.WithMaxAttempts(1)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// s3Completing picks S3's CompleteMultipartUpload: a POST to the object
// with an uploadId. S3 documents that it is to be sent again when it fails.
func s3Completing(r *http.Request) bool {
	return r != nil && r.Method == http.MethodPost && r.URL.Query().Has("uploadId")
}

// s3RetryIf is the default classification, and S3's 200 OK with an
// <Error> of a kind that passes, which CompleteMultipartUpload may answer
// since it sends the status before the work is done. PeekBody reads the
// start of the body and leaves it whole for minio-go.
func s3RetryIf(resp *http.Response, err error) bool {
	if resp != nil && resp.StatusCode == http.StatusOK && s3Completing(resp.Request) {
		prefix, _ := retryhttp.PeekBody(resp, 1024)
		if !bytes.Contains(prefix, []byte("<Error>")) {
			return false
		}
		for _, code := range []string{"InternalError", "SlowDown", "ServiceUnavailable"} {
			if bytes.Contains(prefix, []byte("<Code>"+code+"</Code>")) {
				return true
			}
		}
		return false
	}
	return retryhttp.DefaultRetryIf(resp, err)
}

// TestMinioCompleteMultipartError proves what S3's 200 OK with an <Error>
// on CompleteMultipartUpload costs with minio-go's retries off: without a
// predicate, retryhttp sees a 200 and the upload fails with minio's
// InternalError; with WithRetryIf(s3RetryIf) alone it is still sent once,
// since it is a POST (ReasonNotIdempotent); with WithSafeToRepeat(s3Completing) beside it, it is
// sent again and the upload succeeds.
func TestMinioCompleteMultipartError(t *testing.T) {
	t.Parallel()
	data := randomBytes(5<<20 + 1<<10) // 5 MiB parts: two
	for _, tc := range []struct {
		name      string
		opts      []retryhttp.Option
		completes int
		reasons   string // of the refused retries
		ok        bool
	}{
		{"no predicate", nil, 1, "[]", false},
		{"WithRetryIf alone", []retryhttp.Option{retryhttp.WithRetryIf(s3RetryIf)}, 1, "[not idempotent]", false},
		{"WithRetryIf and WithSafeToRepeat", []retryhttp.Option{retryhttp.WithRetryIf(s3RetryIf), retryhttp.WithSafeToRepeat(s3Completing)}, 2, "[]", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newS3Multipart()
			s.completeError = true
			_, ts := loopbackStub(t, s.answer)
			var reasons []retryhttp.Reason
			var mu sync.Mutex
			opts := append([]retryhttp.Option{retryhttp.WithOnGiveUp(func(e retryhttp.RetryEvent) {
				mu.Lock()
				defer mu.Unlock()
				reasons = append(reasons, e.Reason)
			})}, tc.opts...)
			info, err := minioAt(t, ts.URL, opts...).PutObject(context.Background(), "bucket", "big.bin",
				bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{PartSize: 5 << 20})
			s.mu.Lock()
			defer s.mu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			if s.completes != tc.completes {
				t.Errorf("CompleteMultipartUpload sent %d times, want %d", s.completes, tc.completes)
			}
			if got := fmt.Sprint(reasons); got != tc.reasons {
				t.Errorf("refused retries %s, want %s", got, tc.reasons)
			}
			if tc.ok {
				if err != nil || info.Size != int64(len(data)) {
					t.Errorf("PutObject: %+v, %v; want the upload completed", info, err)
				}
				return
			}
			if minioCode(err) != "InternalError" {
				t.Errorf("err = %v, want minio's InternalError", err)
			}
		})
	}
}

// TestMinioReplayLimitCost proves what WithReplayLimit costs: retryhttp
// copies every part it may have to send again as minio-go sends it,
// retried or not, and holds the copy until the part's request ends. A
// successful upload of two parts (16 MiB and 64 KiB) with
// WithReplayLimit(17 << 20) allocates at least the parts' size more than
// with the default, which copies neither part, and less than eight times
// it (the copy grows as it is read: 83 MiB more here, with Go 1.26).
func TestMinioReplayLimitCost(t *testing.T) {
	data := randomBytes(16<<20 + 64<<10)
	allocated := func(opts ...retryhttp.Option) uint64 {
		s := newS3Multipart()
		_, ts := loopbackStub(t, s.answer)
		c := minioAt(t, ts.URL, opts...)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if _, err := c.PutObject(context.Background(), "bucket", "big.bin", bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	plain, copied := allocated(), allocated(retryhttp.WithReplayLimit(17<<20))
	extra := int64(copied) - int64(plain)
	t.Logf("allocated %.1f MiB with the default limit, %.1f MiB with 17 MiB: %.1f MiB more",
		float64(plain)/(1<<20), float64(copied)/(1<<20), float64(extra)/(1<<20))
	if extra < int64(len(data)) || extra > 8*int64(len(data)) {
		t.Errorf("WithReplayLimit(17 << 20) allocated %d bytes more, want from 1 to 8 times the %d bytes of the parts", extra, len(data))
	}
}
