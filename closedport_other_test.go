//go:build !unix

package retryhttp

import "testing"

// boundPort is unix's; elsewhere closedPort closes a listener instead.
func boundPort(testing.TB) (string, bool) { return "", false }
