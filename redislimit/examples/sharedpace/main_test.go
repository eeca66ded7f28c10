package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/retryhttp/retryhttp/redislimit/internal/redistest"
)

func TestMain(m *testing.M) {
	// The test binary is also the workers' program.
	if os.Getenv(envWorker) != "" {
		if err := worker(); err != nil {
			os.Stderr.WriteString("worker: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	redistest.Cleanup()
	os.Exit(code)
}

func TestSharedPace(t *testing.T) {
	// A generous timeout: on a loaded test machine a loopback call can
	// stall past the default 50 ms, and a worker pacing on its own for a
	// moment would blur the figure this test checks.
	c := config{redis: redistest.Addr(t), workers: 3, pace: 20, dur: 2 * time.Second, timeout: time.Second}
	var out bytes.Buffer
	results, err := run(context.Background(), c, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	local, shared := results[0], results[1]
	if want := 3 * c.pace; math.Abs(local.rate-want) > 0.1*want {
		t.Errorf("in-process pacers: %.1f/s, want about %.0f/s", local.rate, want)
	}
	if math.Abs(shared.rate-c.pace) > 0.05*c.pace {
		t.Errorf("shared: %.1f/s, want %.0f/s within 5%%", shared.rate, c.pace)
	}
	for i, n := range shared.perWorker {
		if n == 0 {
			t.Errorf("worker %d sent nothing in the shared run", i)
		}
	}
	for _, want := range []string{"in-process pacers", "shared through Redis", "combined rate"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestNoRedis(t *testing.T) {
	// A loopback port that nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := config{redis: addr, workers: 2, pace: 20, dur: 500 * time.Millisecond}
	var out bytes.Buffer
	results, err := run(context.Background(), c, &out)
	t.Logf("output:\n%s", out.String())
	if !errors.Is(err, errNoRedis) {
		t.Fatalf("error %v, want errNoRedis", err)
	}
	if len(results) != 1 {
		t.Errorf("%d results, want the in-process run only", len(results))
	}
	if !strings.Contains(out.String(), "no Redis reachable at "+addr) {
		t.Errorf("output does not say Redis is missing")
	}
}
