package retryhttp

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// Logs and errors name a request by method, scheme, host and path only:
// queries carry tokens, and user info carries passwords.

func methodOf(req *http.Request) string {
	if req.Method == "" {
		return http.MethodGet
	}
	return req.Method
}

func pathOf(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	return req.URL.EscapedPath()
}

func redactedURL(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	u := url.URL{Scheme: req.URL.Scheme, Host: req.URL.Host, Path: req.URL.Path, RawPath: req.URL.RawPath}
	return u.String()
}

// logError is an error's text without the URL a *url.Error adds, which
// may carry a query or a password: such an error, outermost or wrapped,
// is shown as its operation and its own error only.
func logError(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err.Error()
	}
	inner := logError(ue.Err)
	if ue == err {
		return ue.Op + ": " + inner
	}
	// A wrapper around the *url.Error: keep its words, drop the URL.
	return strings.Replace(err.Error(), ue.Error(), ue.Op+": "+inner, 1)
}
