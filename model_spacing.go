package retryhttp

import "math"

// spacing tells a rate limit from refusals at random, for attempts sent one
// at a time: nothing sent alone overloads a host's capacity, but one sent
// alone can still come too soon for its rate (nginx's limit_req refuses
// whatever comes within 1/rate of the last it let through). Such a limit
// refuses the attempts sent soon after the last it accepted and accepts
// those sent after a wait (a backoff); a host that refuses at random does
// not care when they come. So the gap from the send of the last accepted
// attempt to each attempt sent alone is kept, as a mean and variance of its
// logarithm, for the accepted and for the refused apart.
//
// A client that backs off only after a refusal spaces its attempts that
// way against a host that refuses every other request, too: what the gaps
// show is a suspicion, and the cut it makes is checked like any other
// (checkCut): a share refused that the pace does not lower is chance.
type spacing struct {
	lastOK instant // the send of the latest accepted attempt
	ok, no gapStats
}

// gapStats is an exponentially weighted mean and variance of log gaps,
// over about spacingMemory of them.
type gapStats struct{ n, mean, v float32 }

const (
	// spacingMemory is how many gaps each mean remembers: enough for its
	// variance to mean something, few enough that a host that changed is
	// seen within a few dozen requests.
	spacingMemory = 30
	// spacingMin is the fewest gaps of each kind the test reads: a
	// difference of means over fewer says nothing of their spread (at 3,
	// 13 of 400 hosts refusing at random were taken for a rate at
	// spacingT 4).
	spacingMin = 5
	// spacingRatio is how much sooner after an accepted attempt the
	// refused came, at least, in their geometric means: a limit refuses
	// what comes within an interval and accepts what comes after a
	// backoff, tens of times longer; a host refusing at random shows a
	// ratio near 1 either way.
	spacingRatio = 4
	// spacingT is the t statistic (Welch's) the difference must reach.
	// One caller's gaps are few and come in two kinds (at once, or after a
	// backoff), far from a normal spread, and each refusal tests again:
	// at 4, 7 of 400 hosts refusing at random were taken for a rate
	// within 60 attempts; at 6, none, and every limit but 1 was told
	// (TestSpacingTellsRateFromChance).
	spacingT = 6
)

// spread is the variance of the mean: the sample's variance (n-1 in its
// denominator: the weighted one is the population's, too small for a few)
// over n, which is v/(n-1).
func (g *gapStats) spread() float64 { return float64(g.v) / float64(g.n-1) }

func (g *gapStats) add(x float64) {
	g.n = min(g.n+1, spacingMemory)
	a := 1 / g.n
	d := float32(x) - g.mean
	g.mean += a * d
	g.v = (1 - a) * (g.v + a*d*d)
}

// observe counts an answer that says whether the host took its attempt
// (answered).
func (sp *spacing) observe(s *sample) {
	if s.out == refused || s.out == accepted {
		sp.answered(s.sent, s.out == refused, !s.overlap)
	}
}

// answered counts an answer: an accepted one's send is the next gaps'
// start, and an attempt sent alone after one adds its gap.
func (s *spacing) answered(sent instant, refused, alone bool) {
	if alone && !s.lastOK.IsZero() && sent.After(s.lastOK) {
		x := math.Log(sent.Sub(s.lastOK).Seconds())
		if refused {
			s.no.add(x)
		} else {
			s.ok.add(x)
		}
	}
	if !refused {
		s.lastOK = later(s.lastOK, sent)
	}
}

// closer reports refusals that came sooner after an accepted attempt than
// accepted attempts did, by spacingRatio and beyond chance.
func (s *spacing) closer() bool {
	ok, no := s.ok, s.no
	if ok.n < spacingMin || no.n < spacingMin {
		return false
	}
	d := float64(ok.mean - no.mean)
	se := math.Sqrt(ok.spread()+no.spread()) + 1e-9
	return d > math.Log(spacingRatio) && d > spacingT*se
}
