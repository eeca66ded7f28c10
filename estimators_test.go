package retryhttp

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The estimators alone, fed samples as answer makes them: each keeps what
// it is meant to of a sequence of answers, whatever the model does with it.

// at is an instant ms milliseconds after a record's start.
func at(ms int) instant { return instant(longAgo) + instant(ms)*instant(time.Millisecond) }

// answerSample is one answer as a sample: its outcome, when its attempt
// was sent and when it came back (in ms), and its load (0: untracked).
func answerSample(out outcome, sent, came, load int) *sample {
	sig := &Signal{Status: http.StatusOK}
	switch out {
	case refused:
		sig.Status, sig.Refused = http.StatusServiceUnavailable, true
	case failed:
		sig.Status = http.StatusBadGateway
	case served:
		sig.Status = http.StatusInternalServerError
	}
	return &sample{sig: sig, at: at(came), sent: at(sent), out: out, load: load, tracked: load > 0, overlap: load > 1}
}

func TestFailuresCountChancesNotAnswers(t *testing.T) {
	type got struct {
		Streak, Chances int
		Share           float64
	}
	tests := []struct {
		name    string
		answers []*sample
		want    got
	}{
		{
			// 20 refusals of one burst, sent together before any came
			// back: one chance (a bucket refuses what it cannot take at
			// once); then two sent after the first came back: two more.
			name: "a burst is one chance",
			answers: append(repeat(20, func(int) *sample { return answerSample(refused, 0, 20, 5) }),
				answerSample(failed, 1000, 1020, 1), answerSample(failed, 1100, 1120, 1)),
			want: got{Streak: 22, Chances: 3, Share: 1},
		},
		{
			// An attempt sent at the very moment the first failure came
			// back had not heard of it.
			name:    "sent as the first came back",
			answers: []*sample{answerSample(refused, 0, 20, 1), answerSample(refused, 20, 40, 1), answerSample(refused, 21, 41, 1)},
			want:    got{Streak: 3, Chances: 2, Share: 1},
		},
		{
			name: "a success ends the run",
			answers: []*sample{answerSample(failed, 0, 10, 1), answerSample(failed, 20, 30, 1),
				answerSample(accepted, 40, 50, 1), answerSample(failed, 60, 70, 1)},
			want: got{Streak: 1, Chances: 1, Share: 0.75},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f failures
			for _, s := range tt.answers {
				f.observe(s)
			}
			if diff := cmp.Diff(tt.want, got{int(f.streak), int(f.chances), f.failShare}); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestFailuresLimitIsNotAFailure(t *testing.T) {
	var f failures
	s := answerSample(refused, 0, 10, 1)
	s.sig.Status, s.limits = http.StatusTooManyRequests, true
	f.observe(s)
	if f.streak != 0 || f.tallied != 0 {
		t.Errorf("a 429 counted: streak %d, tallied %d; want none (a host that says it limits the rate is up)", f.streak, f.tallied)
	}
}

func TestLoadsRefusedAboveWhatItTook(t *testing.T) {
	tests := []struct {
		name    string
		answers []*sample
		want    uint8
	}{
		{"refused above the most it took, twice", []*sample{answerSample(accepted, 0, 10, 3), answerSample(refused, 20, 21, 4), answerSample(refused, 30, 31, 5)}, aboveOKRun},
		{"refused within it", []*sample{answerSample(accepted, 0, 10, 3), answerSample(refused, 20, 21, 4), answerSample(refused, 30, 31, 2)}, 0},
		{"taken beyond it", []*sample{answerSample(accepted, 0, 10, 3), answerSample(refused, 20, 21, 4), answerSample(accepted, 30, 40, 5)}, 0},
		{"nothing taken to compare with", []*sample{answerSample(refused, 20, 21, 4), answerSample(refused, 30, 31, 5)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l loads
			for _, s := range tt.answers {
				l.observe(s)
			}
			if l.aboveOK != tt.want {
				t.Errorf("aboveOK %d, want %d", l.aboveOK, tt.want)
			}
		})
	}
}

func TestControlCountsAnswersSinceACut(t *testing.T) {
	c := control{cutAt: at(1000)}
	for _, s := range []*sample{
		answerSample(refused, 900, 1010, 1),  // sent before the cut
		answerSample(refused, 1100, 1110, 1), // counted
		answerSample(accepted, 1200, 1210, 1),
		answerSample(failed, 1300, 1310, 1), // no pace explains a failure
	} {
		c.observe(s)
	}
	limit := answerSample(refused, 1400, 1410, 1)
	limit.limits = true // the host's word, not a share
	c.observe(limit)
	if diff := cmp.Diff([2]float32{2, 1}, [2]float32{c.cutAnswers, c.cutRefused}); diff != "" {
		t.Errorf("answers and refusals since the cut (-want +got)\n%s", diff)
	}
}

func TestSpacingTellsRefusedSooner(t *testing.T) {
	var sp spacing
	// Accepted a second after the last accepted, refused 50 ms after it,
	// each sent alone: a rate they come too soon for.
	ms := 0
	for range 8 {
		sp.observe(answerSample(accepted, ms, ms+5, 1))
		sp.observe(answerSample(refused, ms+50, ms+55, 1))
		ms += 1000
	}
	if !sp.closer() {
		t.Errorf("refusals 50 ms after an accepted attempt, accepted ones a second after: not told closer")
	}
	var chance spacing
	ms = 0
	for i := range 16 {
		out := accepted
		if i%3 == 0 {
			out = refused
		}
		chance.observe(answerSample(out, ms, ms+5, 1))
		ms += 500
	}
	if chance.closer() {
		t.Errorf("refusals as late as accepted answers told closer")
	}
}

func repeat(n int, f func(int) *sample) []*sample {
	s := make([]*sample, n)
	for i := range s {
		s[i] = f(i)
	}
	return s
}

func TestQuotaWindowThatRestarts(t *testing.T) {
	announce := func(q *quota, ms, left int, reset time.Duration) {
		s := &sample{sig: &Signal{Status: http.StatusOK, Limit: 10, Reset: reset, Remaining: left}, at: at(ms), sent: at(ms)}
		q.observe(s)
	}
	for _, tc := range []struct {
		name     string
		reset    time.Duration // what the first answer after the reset says
		restarts bool
	}{
		// Spent at 0 s with its reset 10 s away, asked again at 15 s: a
		// window that starts at its first request names 10 s from then.
		{"starts at its first request", 10 * time.Second, true},
		// One on a schedule of its own names its next boundary, 20 s.
		{"on its own schedule", 5 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q quota
			announce(&q, 0, 0, 10*time.Second)
			q.tokens(at(15000))     // its reset passed: the window rolls, as the next reserve finds it
			q.taken, q.since = 1, 1 // the probe after the reset, as tookQuota counts it
			announce(&q, 15000, 9, tc.reset)
			if q.restarts != tc.restarts || q.sliding {
				t.Errorf("restarts %v, sliding %v; want restarts %v, not sliding", q.restarts, q.sliding, tc.restarts)
			}
		})
	}
}
