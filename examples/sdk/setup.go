package main

import (
	"net/http"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	azruntime "github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-github/v93/github"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"github.com/slack-go/slack"
)

// newS3 returns an S3 client whose requests go through hc, with the SDK's
// own retries off. cfg is what config.LoadDefaultConfig returned.
//
// The client is set here rather than with config.WithHTTPClient, which
// LoadDefaultConfig refuses with a plain *http.Client whenever
// AWS_CA_BUNDLE is set. aws.NopRetryer, rather than RetryMaxAttempts 1,
// hands back the service's error as it is: the latter wraps every
// retryable one in "exceeded maximum number of attempts, 1".
func newS3(cfg aws.Config, hc *http.Client, optFns ...func(*s3.Options)) *s3.Client {
	off := func(o *s3.Options) {
		o.HTTPClient = hc
		o.Retryer = aws.NopRetryer{}
	}
	return s3.NewFromConfig(cfg, append([]func(*s3.Options){off}, optFns...)...)
}

// newSlack returns a Slack client whose requests go through hc. slack-go
// retries nothing unless given OptionRetry or OptionRetryConfig, so there is
// nothing to turn off; apiURL is for tests and is slack.APIURL otherwise.
func newSlack(token, apiURL string, hc *http.Client) *slack.Client {
	return slack.New(token, slack.OptionHTTPClient(hc), slack.OptionAPIURL(apiURL))
}

// newOpenAI returns an OpenAI client whose requests go through hc, with
// openai-go's own retries off: it retries twice by default, POSTs
// included, and would multiply retryhttp's tries. baseURL is for tests
// (https://api.openai.com/v1/ otherwise).
func newOpenAI(baseURL string, hc *http.Client, opts ...openaiopt.RequestOption) openai.Client {
	return openai.NewClient(append([]openaiopt.RequestOption{
		openaiopt.WithHTTPClient(hc),
		openaiopt.WithMaxRetries(0), // retryhttp retries; openai-go must not retry again
		openaiopt.WithBaseURL(baseURL),
		openaiopt.WithAPIKey("sk-local"),
	}, opts...)...)
}

// newAnthropic returns an Anthropic client whose requests go through hc,
// with anthropic-sdk-go's own retries off (it retries twice by default,
// Messages.New included). WithAPIKey keeps the SDK from reading credentials
// from the environment or a profile on disk.
func newAnthropic(baseURL string, hc *http.Client, opts ...anthropicopt.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]anthropicopt.RequestOption{
		anthropicopt.WithHTTPClient(hc),
		anthropicopt.WithMaxRetries(0),
		anthropicopt.WithBaseURL(baseURL),
		anthropicopt.WithAPIKey("sk-ant-local"),
	}, opts...)...)
}

// azureOptions are the azcore.ClientOptions (policy.ClientOptions) to give
// any Azure data-plane client (azblob, azcosmos, the Azure OpenAI client
// and the others): its requests go through hc, and azcore's own retry
// policy makes one try. MaxRetries must be negative: 0 means azcore's
// default, 3 retries.
func azureOptions(hc *http.Client) policy.ClientOptions {
	return policy.ClientOptions{
		Transport: hc,
		Retry:     policy.RetryOptions{MaxRetries: -1},
	}
}

// newAzurePipeline is the pipeline every Azure data-plane client builds
// from its options, here from azureOptions(hc).
func newAzurePipeline(hc *http.Client) azruntime.Pipeline {
	opts := azureOptions(hc)
	return azruntime.NewPipeline("retryhttp-example", "v0.0.0", azruntime.PipelineOptions{}, &opts)
}

// newGitHub returns a GitHub client whose requests go through hc.
// go-github retries nothing itself (unless a request's context carries
// github.SleepUntilPrimaryRateLimitResetWhenRateLimited, which waits for a
// reset however far away), so there is nothing to turn off. baseURL is for
// tests (https://api.github.com/ otherwise).
func newGitHub(baseURL string, hc *http.Client) (*github.Client, error) {
	return github.NewClient(github.WithHTTPClient(hc), github.WithURLs(&baseURL, &baseURL), github.WithAuthToken("ghp_local"))
}

// minioCreds are the credentials of the examples; an application has its
// own.
var minioCreds = credentials.NewStaticV4("AKIDLOCAL", "secretlocal", "")

// newMinio returns a minio client whose requests go through rt (a
// retryhttp.Transport: minio takes a RoundTripper, not a client), with
// minio-go's own retries off: MaxRetries 1 means one try, and 0 means its
// default, 10. Region is set so that no request asks the bucket's location.
func newMinio(endpoint string, rt http.RoundTripper) (*minio.Client, error) {
	return minio.New(endpoint, &minio.Options{
		Creds:        minioCreds,
		Region:       "us-east-1",
		BucketLookup: minio.BucketLookupPath,
		Transport:    rt,
		MaxRetries:   1,
	})
}
