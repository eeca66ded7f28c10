package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// The lab's clock: the order it wakes its participants in, and how it
// wakes a sleeper whose context ends.

func TestClockOrder(t *testing.T) {
	c := NewClock()
	var order []string
	step := func(name string, d time.Duration) func() {
		return func() {
			c.Sleep(context.Background(), d)
			order = append(order, name+"@"+c.Since().String())
		}
	}
	c.Run(step("a", 2*time.Second), step("b", time.Second), step("c", 2*time.Second), step("d", 0))
	got := strings.Join(order, " ")
	if want := "d@0s b@1s a@2s c@2s"; got != want {
		t.Errorf("woke in order %q, want %q", got, want)
	}
}

func TestClockCancel(t *testing.T) {
	c := NewClock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := (NewClock()).Sleep(ctx, 0); err != nil {
		t.Fatalf("Sleep(0) = %v", err)
	}
	var err error
	var at time.Duration
	c.Run(func() {
		err = c.Sleep(ctx, time.Hour)
		at = c.Since()
	}, func() {
		cancel()
		// The clock settles before it moves on: the sleeper wakes at 0.
		c.Sleep(context.Background(), time.Second)
	})
	if !errors.Is(err, context.Canceled) || at != 0 {
		t.Errorf("cancelled Sleep returned %v at %v, want context.Canceled at 0s", err, at)
	}
	if err := c.Sleep(ctx, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep with a done context = %v, want context.Canceled", err)
	}
}

// TestClockSettles checks sleepers whose contexts a goroutine outside the
// clock cancels, as retryhttp's wait for a slot in flight does: they wake
// at the instant of the cancellation, after the participants due then, in
// the order they went to sleep, on every run.
func TestClockSettles(t *testing.T) {
	for range 20 {
		c := NewClock()
		freed := make(chan struct{})
		var mu sync.Mutex
		var order []string
		note := func(s string) {
			mu.Lock()
			order = append(order, s+"@"+c.Since().String())
			mu.Unlock()
		}
		sleeper := func(name string) func() {
			return func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() { // not a participant: it runs in real time
					select {
					case <-freed:
						cancel()
					case <-ctx.Done():
					}
				}()
				if err := c.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
					t.Errorf("%s: Sleep = %v, want context.Canceled", name, err)
				}
				note(name)
			}
		}
		c.Run(sleeper("a"), sleeper("b"), sleeper("c"), func() {
			c.Sleep(context.Background(), time.Second)
			close(freed)
			note("closer")
			c.Sleep(context.Background(), time.Second)
			note("closer")
		}, func() {
			c.Sleep(context.Background(), time.Second)
			note("other")
		})
		if got, want := strings.Join(order, " "), "closer@1s other@1s a@1s b@1s c@1s closer@2s"; got != want {
			t.Fatalf("woke in order %q, want %q", got, want)
		}
	}
}
