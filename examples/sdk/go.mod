module github.com/retryhttp/retryhttp/examples/sdk

go 1.26.0

replace github.com/retryhttp/retryhttp => ../../

require (
	github.com/retryhttp/retryhttp v0.0.0-00010101000000-000000000000
	github.com/stripe/stripe-go/v82 v82.5.1
)

require (
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	golang.org/x/time v0.16.0 // indirect
)
