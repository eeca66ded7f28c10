package retryhttp

import (
	"net/url"
	"strings"
)

// hostKey names the host an attempt goes to as net/http would dial it:
// lower case, without the scheme's default port or an empty one, without
// the trailing dot of a fully qualified name, and an internationalised name
// in its ASCII (punycode) form. It allocates only for a host that needs one
// of these changes.
func hostKey(u *url.URL) string {
	if u == nil {
		return ""
	}
	return canonicalHost(u.Scheme, u.Host)
}

func canonicalHost(scheme, h string) string {
	name, port := splitHostPort(h)
	if port == "" || (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		h, port = name, ""
	}
	if plainHost(name) && port == "" {
		return h
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if !isASCII(name) {
		name = toPunycode(name)
	}
	if port != "" {
		return name + ":" + port
	}
	return name
}

// splitHostPort splits host[:port], keeping an IPv6 literal's brackets.
func splitHostPort(h string) (name, port string) {
	i := strings.LastIndexByte(h, ':')
	if i < 0 || strings.LastIndexByte(h, ']') > i {
		return h, ""
	}
	return h[:i], h[i+1:]
}

// bareHash is hostHash(h), made in the pass that tells whether h is a bare
// name, canonical already (no colon, lower-case ASCII, no trailing dot:
// what canonicalHost returns as it is, and most hosts are); ok is false
// for any other h, and the hash then unmade.
func bareHash(h string) (sum uint32, ok bool) {
	sum = fnvOffset
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c >= 0x80 || ('A' <= c && c <= 'Z') || c == ':' {
			return 0, false
		}
		sum ^= uint32(c)
		sum *= fnvPrime
	}
	return sum, len(h) == 0 || h[len(h)-1] != '.'
}

// plainHost reports whether name is already canonical: lower-case ASCII,
// no trailing dot.
func plainHost(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 0x80 || ('A' <= c && c <= 'Z') {
			return false
		}
	}
	return !strings.HasSuffix(name, ".")
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// normalizeHostOption accepts what a user may pass to WithHostPace: a bare
// host, host:port, an IPv6 address with or without brackets, or a URL.
func normalizeHostOption(host string) string {
	host = strings.TrimSpace(host)
	if strings.Contains(host, "://") {
		if u, err := url.Parse(host); err == nil {
			return hostKey(u)
		}
	}
	if strings.Count(host, ":") > 1 && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]" // a bare IPv6 address, as a URL writes it
	}
	name, port := splitHostPort(host)
	if port == "443" || port == "80" {
		host = name
	}
	return canonicalHost("", host)
}
