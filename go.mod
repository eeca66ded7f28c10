module github.com/retryhttp/retryhttp

go 1.26.0

require (
	github.com/hashicorp/go-cleanhttp v0.5.2
	golang.org/x/time v0.16.0
)

require github.com/google/go-cmp v0.7.0
