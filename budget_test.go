package retryhttp

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Integer accounting: n first tries at 10 % allow exactly n/10 retries, no
// float rounding lost or gained.
func TestBudgetFixedPoint(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, firsts := range []int{0, 9, 10, 11, 30, 100, 999, 1000} {
		b := NewBudget(0.1, 0)
		for range firsts {
			b.recordFirst(now)
		}
		got := 0
		for range firsts + 5 {
			if b.tryRetry(now) {
				got++
			}
		}
		if want := firsts / 10; got != want {
			t.Errorf("%d first tries at 10%%: %d retries, want %d", firsts, got, want)
		}
	}
}

// The reserve lets a quiet client retry a blip: minPerSecond retries a
// second over the 10 s window, with no first tries at all.
func TestBudgetReserve(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := NewBudget(0.1, 1)
	got := 0
	for range 20 {
		if b.tryRetry(now) {
			got++
		}
	}
	if got != 10 {
		t.Errorf("reserve of 1/s over 10 s: %d retries, want 10", got)
	}
}

// First tries and retries older than the window no longer count.
func TestBudgetWindowSlides(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	b := NewBudget(0.1, 0)
	for range 10 {
		b.recordFirst(start)
	}
	if !b.tryRetry(start) || b.tryRetry(start) {
		t.Fatal("10 first tries should allow exactly one retry")
	}
	// 9 s later both still count; at 10 s both have left the window.
	if b.tryRetry(start.Add(9 * time.Second)) {
		t.Error("retry allowed at 9 s though the window still holds the spent one")
	}
	later := start.Add(10 * time.Second)
	if b.tryRetry(later) {
		t.Error("retry allowed at 10 s though the first tries have left the window")
	}
	for range 10 {
		b.recordFirst(later)
	}
	if !b.tryRetry(later) {
		t.Error("new first tries should earn a new retry")
	}
}

func TestBudgetArguments(t *testing.T) {
	tests := []struct {
		ratio, min       float64
		wantRatio, wantR uint64
	}{
		{0.1, 1, 100_000, 10_000_000},
		{-1, -1, 0, 0},
		{nanf(), nanf(), 0, 0},
		{1e9, 1e12, 100_000_000, 10_000_000_000_000},
	}
	for _, tt := range tests {
		b := NewBudget(tt.ratio, tt.min)
		if b.ratio != tt.wantRatio || b.reserve != tt.wantR {
			t.Errorf("NewBudget(%v, %v) = %d, %d; want %d, %d", tt.ratio, tt.min, b.ratio, b.reserve, tt.wantRatio, tt.wantR)
		}
	}
}

// The seed's outage: 100 pages from a host answering 503 to everything,
// 3 tries each. Without a budget that is 300 requests; with 10 % and no
// reserve, 110.
func TestBudgetOutage(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want int
	}{
		{"no budget", []Option{WithBudget(nil), WithLearning(false)}, 300},
		{"10% budget", []Option{WithBudget(NewBudget(0.1, 0)), WithLearning(false)}, 110},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := newStub(nil)
				host.scripts = map[string][]step{}
				for i := range 100 {
					host.scripts[fmt.Sprintf("/catalogue/%d", i)] = []step{{status: 503}}
				}
				net := newPipeNet(host)
				defer net.close()
				var ev events
				tr := New(append([]Option{WithBase(net.tr), onEvents(ev.add), fixedRand(0)}, tt.opts...)...)
				for i := range 100 {
					if code, _ := get(t, tr, fmt.Sprintf("http://flaky.test/catalogue/%d", i)); code != 503 {
						t.Fatalf("page %d: %d, want 503", i, code)
					}
				}
				if got := host.count(""); got != tt.want {
					t.Errorf("%d requests reached the host, want %d", got, tt.want)
				}
				refused := 0
				for _, e := range ev.list() {
					if e.Reason == ReasonBudget {
						refused++
					}
				}
				// 90 pages refused a first retry, and the 10 retried refused a second.
				if tt.want == 110 && refused != 100 {
					t.Errorf("%d retries refused for the budget, want 100", refused)
				}
			})
		})
	}
}

// TestBudgetRefundsSucceededRetries: a sequential client against a host
// whose every page fails twice before it serves: 100 pages need 200
// retries, ten times what the default budget (10 %, and 10 retries in
// reserve) allows in the run. Retries that end in success are refunded, all of them, so
// every page is served with 300 requests; an outage on the same budget is
// still held to 110 (TestBudgetOutage).
func TestBudgetRefundsSucceededRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(nil)
		host.scripts = map[string][]step{}
		for i := range 100 {
			host.scripts[fmt.Sprintf("/item/%d", i)] = []step{{status: 503}, {status: 502}, {status: 200}}
		}
		net := newPipeNet(host)
		defer net.close()
		tr := New(WithBase(net.tr), WithLearning(false), fixedRand(0))
		for i := range 100 {
			if code, _ := get(t, tr, fmt.Sprintf("http://flaky.test/item/%d", i)); code != 200 {
				t.Fatalf("item %d: %d, want 200", i, code)
			}
		}
		if got := host.count(""); got != 300 {
			t.Errorf("%d requests reached the host, want 300", got)
		}
	})
}

// One Budget shared by two Transports counts the first tries of both.
func TestBudgetShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := newStub(map[string][]step{"/down": {{status: 503}}})
		net := newPipeNet(host)
		defer net.close()
		b := NewBudget(0.5, 0)
		a := New(WithBase(net.tr), WithBudget(b), WithMaxAttempts(2), fixedRand(0))
		c := New(WithBase(net.tr), WithBudget(b), WithMaxAttempts(2), fixedRand(0))
		var got []int
		for _, tr := range []*Transport{a, c, a, c} {
			before := host.count("")
			get(t, tr, "http://x.test/down")
			got = append(got, host.count("")-before)
		}
		// a: 1 first, 0.5 retries earned: none. c: 2 firsts, 1 earned: a
		// retry. a: 3 firsts, 1.5 earned, 1 spent: none. c: 4, 2, 1: a retry.
		if diff := cmp.Diff([]int{1, 2, 1, 2}, got); diff != "" {
			t.Errorf("requests per call (-want +got):\n%s", diff)
		}
	})
}

func nanf() float64 { var z float64; return z / z }

// stepClock is a Clock that says what it is told.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time                             { return c.now }
func (c *stepClock) Sleep(context.Context, time.Duration) error { return nil }

// TestLazyCounterUndated: first tries counted without a clock reading (the
// calm success path) count as dated ones do within a second, and a batch
// over several seconds is spread over them, never before its first event
// and never past the window.
func TestLazyCounterUndated(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	clk := &stepClock{now: t0}
	b := NewBudget(0.1, 0)
	for range 10 {
		b.firsts.addUndated(clk) // as a calm call counts its first try
	}
	if !b.tryRetry(t0) || b.tryRetry(t0) {
		t.Error("10 undated first tries at 10 % should allow exactly one retry")
	}

	// A steady 10 a second for 6.3 s: the batch closes at its 64th event
	// and is spread over its 6.3 s.
	var c lazyCounter
	for i := range undatedBatch {
		clk.now = t0.Add(time.Duration(i) * 100 * time.Millisecond)
		c.addUndated(clk)
	}
	now := clk.now
	if got := c.sum(now); got != undatedBatch {
		t.Errorf("sum %d, want %d", got, undatedBatch)
	}
	if got := c.lastSecond(now); got < 8 || got > 12 {
		t.Errorf("last second %.1f, want about 10", got)
	}

	// An open batch read 30 s after its first event: spread over the 30 s,
	// what falls before the window is not counted.
	var d lazyCounter
	clk.now = t0
	for range 30 {
		d.addUndated(clk)
	}
	if got := d.sum(t0.Add(30 * time.Second)); got < 9 || got > 11 {
		t.Errorf("30 events over 30 s read at its end: %d in the window, want about 10", got)
	}
	if got := d.sum(t0.Add(30 * time.Second)); got > 11 {
		t.Errorf("read again: %d", got)
	}
}
