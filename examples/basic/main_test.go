package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"  hook: try 1 got 503, retrying\n",
		"hook: try 2 got 503, retrying",
		`msg="retryhttp: retrying" method=GET`,
		`path=/flaky attempt="3 of 4" status=503 wait=`,
		"=> 200 OK after 3 request(s)\n",
		`path=/limited attempt="2 of 4" status=429 wait=1` + "\n",
		"=> 200 OK after 2 request(s), 1 s of it waiting as the server asked\n",
		"GET /missing\n  => 404 Not Found after 1 request(s)\n",
		"POST /orders\n  hook: try 1 got 503, not retried: not idempotent\n",
		`reason="not idempotent"`,
		"=> 503 Service Unavailable after 1 request(s)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q; it is:\n%s", want, got)
		}
	}
	if strings.Contains(got, "time=") {
		t.Errorf("log lines carry a time:\n%s", got)
	}
}
