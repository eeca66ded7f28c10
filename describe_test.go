package retryhttp

import (
	"fmt"
	"net/http"
	"testing"
)

// TestDescribeAsFmt: the lines describe makes once are fmt's, for every
// status, known or not.
func TestDescribeAsFmt(t *testing.T) {
	for code := -1; code < 1000; code++ {
		if code == 0 {
			continue
		}
		s := Signal{Status: code}
		if got, want := s.describe(), fmt.Sprintf("%d %s", code, http.StatusText(code)); got != want {
			t.Fatalf("status %d: %q, want %q", code, got, want)
		}
	}
}
