package main

import (
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
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
