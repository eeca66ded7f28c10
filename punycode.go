package retryhttp

import (
	"strings"
	"unicode/utf8"
)

// toPunycode returns a domain name with each label that is not ASCII in
// its ACE form, "xn--" and the label's punycode (RFC 3492), as net/http
// sends it. It maps nothing else (no IDNA normalisation beyond the lower
// case the caller applied): it only has to name one host one way.
func toPunycode(name string) string {
	labels := strings.Split(name, ".")
	for i, l := range labels {
		if !isASCII(l) && utf8.ValidString(l) {
			labels[i] = "xn--" + punycodeEncode(l)
		}
	}
	return strings.Join(labels, ".")
}

// punycodeEncode is RFC 3492's encoding procedure, with its parameters.
func punycodeEncode(label string) string {
	const (
		base, tmin, tmax   = 36, 1, 26
		skew, damp         = 38, 700
		initialBias, initN = 72, 128
	)
	runes := []rune(label)
	var out []byte
	for _, r := range runes {
		if r < 0x80 {
			out = append(out, byte(r))
		}
	}
	b := len(out)
	h := b
	if b > 0 {
		out = append(out, '-')
	}
	digit := func(d int) byte {
		if d < 26 {
			return byte('a' + d)
		}
		return byte('0' + d - 26)
	}
	adapt := func(delta, points int, first bool) int {
		if first {
			delta /= damp
		} else {
			delta /= 2
		}
		delta += delta / points
		k := 0
		for delta > ((base-tmin)*tmax)/2 {
			delta /= base - tmin
			k += base
		}
		return k + (base-tmin+1)*delta/(delta+skew)
	}
	n, delta, bias := initN, 0, initialBias
	for h < len(runes) {
		m := int(^uint(0) >> 1)
		for _, r := range runes {
			if int(r) >= n && int(r) < m {
				m = int(r)
			}
		}
		delta += (m - n) * (h + 1)
		n = m
		for _, r := range runes {
			if int(r) < n {
				delta++
			}
			if int(r) != n {
				continue
			}
			q := delta
			for k := base; ; k += base {
				t := k - bias
				if t < tmin {
					t = tmin
				} else if t > tmax {
					t = tmax
				}
				if q < t {
					break
				}
				out = append(out, digit(t+(q-t)%(base-t)))
				q = (q - t) / (base - t)
			}
			out = append(out, digit(q))
			bias = adapt(delta, h+1, h == b)
			delta = 0
			h++
		}
		delta++
		n++
	}
	return string(out)
}
