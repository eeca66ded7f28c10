package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
	"github.com/retryhttp/retryhttp"
)

// awsConfig is what config.LoadDefaultConfig gives an application, less
// what would make a test depend on the machine: shared files, and the
// credential and region chains.
func awsConfig(t *testing.T, opts ...func(*config.LoadOptions) error) aws.Config {
	t.Helper()
	cfg, err := config.LoadDefaultConfig(context.Background(), append([]func(*config.LoadOptions) error{
		config.WithRegion("us-east-1"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")),
		config.WithSharedConfigFiles([]string{}),
		config.WithSharedCredentialsFiles([]string{}),
		config.WithLogger(logging.Nop{}),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// s3At is newS3 pointed at a stub.
func s3At(t *testing.T, endpoint string, hc *http.Client, optFns ...func(*s3.Options)) *s3.Client {
	at := func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	}
	return newS3(awsConfig(t), hc, append([]func(*s3.Options){at}, optFns...)...)
}

// sdkRetries puts the SDK's standard retryer back, as an application that
// did not turn it off has it.
func sdkRetries(o *s3.Options) { o.Retryer = retry.NewStandard() }

func s3Error(status int, code string, header ...string) reply {
	h := map[string]string{"Content-Type": "application/xml"}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return reply{status, h, fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>`+
		`<Error><Code>%s</Code><Message>stub says %d</Message><RequestId>REQ</RequestId><HostId>HOST</HostId></Error>`, code, status)}
}

var (
	s3OK      = reply{status: http.StatusOK, header: map[string]string{"ETag": `"etag"`}}
	s3Object  = reply{status: http.StatusOK, header: map[string]string{"Content-Type": "text/plain"}, body: "hello"}
	s3Slow    = s3Error(http.StatusServiceUnavailable, "SlowDown")
	s3Too     = s3Error(http.StatusTooManyRequests, "SlowDown", "Retry-After", "1")
	s3TooLong = s3Error(http.StatusTooManyRequests, "SlowDown", "Retry-After", "120")
)

// s3Payload returns what an upload carried, as S3 would check it: the
// aws-chunked encoding the SDK uses over TLS decoded, its declared decoded
// length, SHA-256 and CRC32 verified.
func s3Payload(h http.Header, body []byte) ([]byte, error) {
	payload, trailer := body, http.Header{}
	if h.Get("Content-Encoding") == "aws-chunked" {
		var err error
		if payload, trailer, err = decodeAWSChunked(body); err != nil {
			return nil, err
		}
		if n, _ := strconv.Atoi(h.Get("X-Amz-Decoded-Content-Length")); n != len(payload) {
			return nil, fmt.Errorf("decoded %d bytes, the header says %d", len(payload), n)
		}
	}
	sum := sha256.Sum256(payload)
	if want := h.Get("X-Amz-Content-Sha256"); !strings.HasPrefix(want, "STREAMING-") && want != "UNSIGNED-PAYLOAD" && want != hex.EncodeToString(sum[:]) {
		return nil, fmt.Errorf("X-Amz-Content-Sha256 %s does not match the payload", want)
	}
	crc := binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE(payload))
	for _, want := range []string{h.Get("X-Amz-Checksum-Crc32"), trailer.Get("X-Amz-Checksum-Crc32")} {
		if want != "" && want != base64.StdEncoding.EncodeToString(crc) {
			return nil, fmt.Errorf("x-amz-checksum-crc32 %s does not match the payload", want)
		}
	}
	return payload, nil
}

// decodeAWSChunked decodes an aws-chunked body: chunks of hex size, then
// a zero chunk and trailing headers.
func decodeAWSChunked(body []byte) (payload []byte, trailer http.Header, err error) {
	r := bufio.NewReader(bytes.NewReader(body))
	trailer = http.Header{}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, nil, fmt.Errorf("aws-chunked: chunk size: %v", err)
		}
		size, _, _ := strings.Cut(strings.TrimSuffix(line, "\r\n"), ";")
		n, err := strconv.ParseInt(size, 16, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("aws-chunked: chunk size %q", size)
		}
		if n == 0 {
			break
		}
		chunk := make([]byte, n+2)
		if _, err := io.ReadFull(r, chunk); err != nil || !bytes.HasSuffix(chunk, []byte("\r\n")) {
			return nil, nil, fmt.Errorf("aws-chunked: chunk of %d bytes cut short", n)
		}
		payload = append(payload, chunk[:n]...)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, nil, fmt.Errorf("aws-chunked: trailer: %v", err)
		}
		line = strings.TrimSuffix(line, "\r\n")
		if line == "" {
			return payload, trailer, nil
		}
		k, v, _ := strings.Cut(line, ":")
		trailer.Add(k, strings.TrimSpace(v))
	}
}

// uploadStub answers the first upload 500 InternalError, as S3 does when
// it failed before storing anything, and later ones 200 if their payload
// checks out, 400 BadDigest if not.
func uploadStub(n int, r *http.Request, body []byte) reply {
	if n == 1 {
		return s3Error(http.StatusInternalServerError, "InternalError")
	}
	if _, err := s3Payload(r.Header, body); err != nil {
		return s3Error(http.StatusBadRequest, "BadDigest")
	}
	return s3OK
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(b)
	return b
}

// TestS3UploadRetriedAfter500 proves that a PutObject of 64 KiB answered
// 500 is retried by retryhttp with the SDK's retries off, and that both
// attempts carry exactly the caller's bytes: over plain http, where the SDK
// signs the payload's SHA-256 and sends its CRC32 in a header, and over
// TLS, where it sends the body aws-chunked with the CRC32 in a trailer.
// The SDK hands Do a body without GetBody, so this needs retryhttp to
// replay what the base transport read.
func TestS3UploadRetriedAfter500(t *testing.T) {
	t.Parallel()
	data := randomBytes(64 << 10)
	for _, tc := range []struct {
		name    string
		tls     bool
		chunked bool
	}{
		{"http, payload signed", false, false},
		{"https, aws-chunked with a trailing checksum", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{answer: uploadStub}
			var client *s3.Client
			if tc.tls {
				ts := httptest.NewTLSServer(rec)
				t.Cleanup(ts.Close)
				client = s3OverTLS(t, ts)
			} else {
				ts := httptest.NewServer(rec)
				t.Cleanup(ts.Close)
				client = s3At(t, ts.URL, fast(nil))
			}

			_, err := client.PutObject(context.Background(), &s3.PutObjectInput{
				Bucket: aws.String("bucket"), Key: aws.String("key"), Body: bytes.NewReader(data),
			})
			hits := rec.Hits()
			if err != nil {
				t.Fatalf("PutObject: %v (the stub answered %s)", err, statuses(hits))
			}
			if len(hits) != 2 || hits[0].Status != 500 || hits[1].Status != 200 {
				t.Fatalf("the stub answered %s, want [500 200]", statuses(hits))
			}
			if got := hits[0].Header.Get("Content-Encoding") == "aws-chunked"; got != tc.chunked {
				t.Errorf("aws-chunked: %v, want %v (headers %v)", got, tc.chunked, hits[0].Header)
			}
			first, second := sha256.Sum256(hits[0].Body), sha256.Sum256(hits[1].Body)
			if first != second {
				t.Errorf("the attempts' bodies differ: %d bytes, sha256 %x; %d bytes, sha256 %x",
					len(hits[0].Body), first, len(hits[1].Body), second)
			}
			for i, h := range hits {
				payload, err := s3Payload(h.Header, h.Body)
				if err != nil {
					t.Errorf("attempt %d: %v", i+1, err)
				} else if sha256.Sum256(payload) != sha256.Sum256(data) {
					t.Errorf("attempt %d carried %d bytes that are not the caller's %d", i+1, len(payload), len(data))
				}
			}
		})
	}
}

// s3OverTLS returns newS3 for a TLS stub whose certificate the application
// trusts through a CA bundle (AWS_CA_BUNDLE, or here config.WithCustomCABundle):
// retryhttp's base is the transport LoadDefaultConfig built with it.
func s3OverTLS(t *testing.T, ts *httptest.Server) *s3.Client {
	bundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	cfg := awsConfig(t, config.WithCustomCABundle(bytes.NewReader(bundle)))
	withBundle := cfg.HTTPClient.(*awshttp.BuildableClient).GetTransport()
	return newS3(cfg, fast(withBundle), func(o *s3.Options) {
		o.BaseEndpoint = aws.String(ts.URL)
		o.UsePathStyle = true
	})
}

// TestS3WithHTTPClientRefusedWithCABundle proves why newS3 sets the client
// on the service: config.WithHTTPClient with a plain *http.Client makes
// LoadDefaultConfig fail as soon as a CA bundle is configured.
func TestS3WithHTTPClientRefusedWithCABundle(t *testing.T) {
	t.Parallel()
	_, err := config.LoadDefaultConfig(context.Background(),
		config.WithRegion("us-east-1"),
		config.WithSharedConfigFiles([]string{}),
		config.WithSharedCredentialsFiles([]string{}),
		config.WithHTTPClient(retryhttp.NewClient()),
		config.WithCustomCABundle(strings.NewReader("any bundle")),
	)
	if err == nil || !strings.Contains(err.Error(), "unable to add custom RootCAs HTTPClient") {
		t.Fatalf("LoadDefaultConfig: %v, want it to refuse the *http.Client", err)
	}
}

// TestS3UploadForbiddenNotRetried proves that a 403 on PutObject reaches
// the stub once and comes back as the SDK's API error.
func TestS3UploadForbiddenNotRetried(t *testing.T) {
	t.Parallel()
	rec, ts := loopbackStub(t, replies(s3Error(http.StatusForbidden, "AccessDenied")))
	_, err := s3At(t, ts.URL, fast(nil)).PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String("bucket"), Key: aws.String("key"), Body: bytes.NewReader(randomBytes(64 << 10)),
	})
	checkAPIError(t, err, http.StatusForbidden, "AccessDenied")
	if hits := rec.Hits(); len(hits) != 1 {
		t.Errorf("the stub answered %s, want one 403", statuses(hits))
	}
}

// TestS3LargeUpload proves what happens to an upload larger than what
// retryhttp replays (256 KiB by default): with the SDK's retries off, the
// 500 comes back after one attempt; with the SDK's retryer passed to that
// call only, the SDK rewinds its stream and sends it again, each attempt
// once.
func TestS3LargeUpload(t *testing.T) {
	t.Parallel()
	data := randomBytes(1 << 20)
	for _, tc := range []struct {
		name   string
		optFns []func(*s3.Options)
		want   string
	}{
		{"SDK retries off", nil, "[500]"},
		{"SDK retryer for this call", []func(*s3.Options){sdkRetries}, "[500 500 200]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := replies(s3Error(500, "InternalError"), s3Error(500, "InternalError"), s3OK)
			rec, ts := loopbackStub(t, sc)
			_, err := s3At(t, ts.URL, fast(nil)).PutObject(context.Background(), &s3.PutObjectInput{
				Bucket: aws.String("bucket"), Key: aws.String("key"), Body: bytes.NewReader(data),
			}, tc.optFns...)
			hits := rec.Hits()
			if got := statuses(hits); got != tc.want {
				t.Fatalf("the stub answered %s, want %s (err %v)", got, tc.want, err)
			}
			if tc.optFns == nil {
				checkAPIError(t, err, http.StatusInternalServerError, "InternalError")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, h := range hits {
				if payload, err := s3Payload(h.Header, h.Body); err != nil || !bytes.Equal(payload, data) {
					t.Errorf("attempt %d did not carry the caller's bytes (%v)", i+1, err)
				}
			}
		})
	}
}

// checkAPIError fails t unless err is the service's answer with this
// status and error code, as the SDK hands it back with its retries off.
func checkAPIError(t *testing.T, err error, status int, code string) {
	t.Helper()
	var apiErr smithy.APIError
	var respErr *awshttp.ResponseError
	var maxErr *retry.MaxAttemptsError
	switch {
	case !errors.As(err, &apiErr) || apiErr.ErrorCode() != code:
		t.Errorf("err = %v, want the API error %s", err, code)
	case !errors.As(err, &respErr) || respErr.HTTPStatusCode() != status:
		t.Errorf("err = %v, want a response error with status %d", err, status)
	case errors.As(err, &maxErr):
		t.Errorf("err = %v, wrapped in a MaxAttemptsError", err)
	}
}

func getObject(ctx context.Context, c *s3.Client, optFns ...func(*s3.Options)) (string, error) {
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bucket"), Key: aws.String("key")}, optFns...)
	if err != nil {
		return "", err
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	return string(b), err
}

// TestS3ThrottleAbsorbed proves that a throttle retryhttp absorbs, S3's
// 503 SlowDown or a 429 with Retry-After: 1, is invisible to the caller of
// GetObject with the SDK's retries off.
func TestS3ThrottleAbsorbed(t *testing.T) {
	t.Parallel()
	for _, throttle := range []reply{s3Slow, s3Too} {
		synctest.Test(t, func(t *testing.T) {
			rec, url, base := bubbleStub(t, replies(throttle, s3Object))
			start := time.Now()
			got, err := getObject(context.Background(), s3At(t, url, fast(base)))
			if err != nil || got != "hello" {
				t.Fatalf("GetObject after %d: %q, %v; want hello", throttle.status, got, err)
			}
			if hits := rec.Hits(); len(hits) != 2 {
				t.Errorf("the stub answered %s, want 2 requests", statuses(hits))
			}
			if throttle.header["Retry-After"] == "1" && time.Since(start) < time.Second {
				t.Errorf("done after %v, before the Retry-After", time.Since(start))
			}
		})
	}
}

// TestS3ThrottleHandedBack proves what the caller gets when retryhttp gives
// up on a throttle, with the SDK's retries off: after three 503 SlowDown
// (or 429) the last one, as the SDK's API error; on a Retry-After beyond
// 60 s the 429 at once, and then, while the host is parked, an error that
// is ErrHostPaused without a request sent.
func TestS3ThrottleHandedBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		answer   reply
		hits     int
		min, max time.Duration // how long the call takes, in the bubble's time
	}{
		// The third try may wait for the pace retryhttp learned from the
		// first two 503s.
		{"503 SlowDown every time", s3Slow, 3, 0, 2 * time.Second},
		{"429 Retry-After: 1 every time", s3Too, 3, 2 * time.Second, 3 * time.Second},
		{"429 Retry-After: 120", s3TooLong, 1, 0, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.answer))
				client := s3At(t, url, fast(base))
				start := time.Now()
				_, err := getObject(context.Background(), client)
				took := time.Since(start)
				checkAPIError(t, err, tc.answer.status, "SlowDown")
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s, want %d requests", statuses(hits), tc.hits)
				}
				if took < tc.min || took > tc.max {
					t.Errorf("the error came after %v, want %v to %v", took, tc.min, tc.max)
				}
				if tc.answer.header["Retry-After"] != "120" {
					return
				}
				nextCallParked(t, rec, "GetObject", func() error { _, err := getObject(context.Background(), client); return err })
			})
		})
	}
}

// TestS3SDKRetriesMultiply proves what leaving the SDK's retryer on under
// retryhttp costs: its 3 attempts times retryhttp's 3, 9 requests for one
// call against a host that fails every time, uploads of 64 KiB included
// (retryhttp replays them); on a Retry-After beyond 60 s, one request, then
// the SDK's retries fail on the parked host without reaching it.
func TestS3SDKRetriesMultiply(t *testing.T) {
	t.Parallel()
	put := func(c *s3.Client) error {
		_, err := c.PutObject(context.Background(), &s3.PutObjectInput{
			Bucket: aws.String("bucket"), Key: aws.String("key"), Body: bytes.NewReader(randomBytes(64 << 10)),
		})
		return err
	}
	get := func(c *s3.Client) error {
		_, err := getObject(context.Background(), c)
		return err
	}
	for _, tc := range []struct {
		name   string
		call   func(*s3.Client) error
		answer reply
		hits   int
	}{
		{"GetObject, 503 SlowDown every time", get, s3Slow, 9},
		{"GetObject, 429 Retry-After: 1 every time", get, s3Too, 9},
		{"GetObject, 500 InternalError every time", get, s3Error(500, "InternalError"), 9},
		{"PutObject 64 KiB, 503 SlowDown every time", put, s3Slow, 9},
		{"GetObject, 429 Retry-After: 120", get, s3TooLong, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec, url, base := bubbleStub(t, replies(tc.answer))
				err := tc.call(s3At(t, url, layered(base), sdkRetries))
				var maxErr *retry.MaxAttemptsError
				if !errors.As(err, &maxErr) || maxErr.Attempt != 3 {
					t.Errorf("err = %v, want the SDK's MaxAttemptsError after 3 attempts", err)
				}
				if hits := rec.Hits(); len(hits) != tc.hits {
					t.Errorf("the stub answered %s: %d requests, want %d", statuses(hits), len(hits), tc.hits)
				}
				if tc.hits == 1 && !errors.Is(err, retryhttp.ErrHostPaused) {
					t.Errorf("err = %v, want the SDK's last attempt to have met ErrHostPaused", err)
				}
			})
		})
	}
}

// TestS3RetryMaxAttemptsOne proves why newS3 uses aws.NopRetryer rather
// than RetryMaxAttempts 1: both leave retrying to retryhttp (3 requests on
// a host that fails every time), but the latter wraps the service's error
// in "exceeded maximum number of attempts, 1".
func TestS3RetryMaxAttemptsOne(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rec, url, base := bubbleStub(t, replies(s3Slow))
		oneAttempt := func(o *s3.Options) {
			o.Retryer = retry.NewStandard()
			o.RetryMaxAttempts = 1
		}
		_, err := getObject(context.Background(), s3At(t, url, fast(base), oneAttempt))
		var maxErr *retry.MaxAttemptsError
		if !errors.As(err, &maxErr) || !strings.Contains(err.Error(), "exceeded maximum number of attempts, 1,") {
			t.Errorf("err = %v, want a MaxAttemptsError", err)
		}
		if hits := rec.Hits(); len(hits) != 3 {
			t.Errorf("the stub answered %s, want 3 requests", statuses(hits))
		}
	})
}

// TestS3RetryQuota proves that with the SDK's retries off its retry quota
// never fails a call: during an outage every call gets the service's
// error, where the SDK's standard retryer, left on, starts failing calls
// with "retry quota exceeded" (ratelimit.QuotaExceededError) within 40.
func TestS3RetryQuota(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		optFns    []func(*s3.Options)
		exhausted bool
	}{
		{"SDK retries off", nil, false},
		{"SDK retryer on", []func(*s3.Options){sdkRetries}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, url, base := bubbleStub(t, replies(s3Error(500, "InternalError")))
				client := s3At(t, url, fast(base), tc.optFns...)
				exhausted := 0
				for range 40 {
					_, err := getObject(context.Background(), client)
					var quota ratelimit.QuotaExceededError
					switch {
					case errors.As(err, &quota):
						exhausted++
					case tc.optFns == nil:
						checkAPIError(t, err, 500, "InternalError")
					}
				}
				if (exhausted > 0) != tc.exhausted {
					t.Errorf("%d of 40 calls failed with retry quota exceeded", exhausted)
				}
			})
		})
	}
}
