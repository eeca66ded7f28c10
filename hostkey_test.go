package retryhttp

import "testing"

// FuzzBareHash holds the one-pass shortcut for bare names to the long way:
// a name bareHash takes must be canonical already and hash as hostHash
// does.
func FuzzBareHash(f *testing.F) {
	for _, h := range []string{"", "api.example.com", "API.example.com", "example.com.", "example.com:443", "[::1]:80", "xn--bcher-kva.example", "bücher.example"} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, h string) {
		sum, ok := bareHash(h)
		if !ok {
			return
		}
		if got := hostHash(h); got != sum {
			t.Errorf("bareHash(%q) = %d, hostHash = %d", h, sum, got)
		}
		for _, scheme := range []string{"", "http", "https"} {
			if got := canonicalHost(scheme, h); got != h {
				t.Errorf("canonicalHost(%q, %q) = %q: a bare name is its own key", scheme, h, got)
			}
		}
	})
}
