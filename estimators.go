package retryhttp

// The host model's estimators. As a Netflix concurrency-limits Limit takes
// its samples, each estimator is a small type that takes in every answer of
// its host through one method (observe) and keeps what it needs of them; it
// decides nothing. The model's transitions (model.go, model_pace.go,
// model_down.go) read them:
//
//	failures  the share of answers that failed, and the run of failures
//	          that may make the host down (model_down.go)
//	control   how the host is held: the learned rate and limit in flight,
//	          and the answers to attempts sent since a cut, which check it
//	          (model_pace.go)
//	loads     what was in flight when the host accepted and when it
//	          refused, and how long it took: whether it limits what it
//	          serves at once (model_slots.go)
//	spacing   the gaps of attempts sent alone, accepted and refused: a rate
//	          that one caller alone hits (model_spacing.go)
//	quota     what the host announces it grants, and the kind of window it
//	          is (model_quota.go)
//
// The counts every decision shares (accepts and refusals over the last
// second, what was sent) are the model's own, as gobreaker's Counts are.

// estimator is one of the host model's estimators.
type estimator interface {
	// observe takes in one answer.
	observe(s *sample)
}

var (
	_ estimator = (*failures)(nil)
	_ estimator = (*control)(nil)
	_ estimator = (*loads)(nil)
	_ estimator = (*spacing)(nil)
	_ estimator = (*quota)(nil)
)

// sample is one answer as the estimators read it: what it said, when its
// attempt went and came back, and the little of the record's state an
// estimator needs beside it, made once per answer by the model (answer).
type sample struct {
	sig  *Signal  // the answer's own figures (a quota's, the wait named, the failure)
	ev   *changes // where an estimator notes what is worth a log line
	at   instant  // when the answer came
	sent instant  // when its attempt was sent
	out  outcome  // what it says of the host, as the model reads it
	// load is how many attempts were in flight at its send, itself
	// included; 0 for an attempt sent before the record (untracked).
	load             int
	tracked, overlap bool // sent with a ticket of this record; sent while another was on its way
	limits           bool // the host said it limits the rate
	fresh            bool // the record is a hold old or less
	state            HostState
	since            instant // when the record was made
	inflight         int32   // the record's attempts in flight, this one answered
	nextSeq          uint32  // the ticket the next attempt gets
	rate             float64 // the learned rate (control), 0: none
	bound            bool    // a request waited for the pace within the last hold
	// What a run of failures that begins with this answer remembers (made
	// only then): what the host accepted in the last second, what the
	// process sent (Signal.Sent), and how the host is held.
	accepted, sentAll float64
	held              holding
	// capRate is the estimators' word back (quota, when it finds its
	// window tight): the learned rate is held to it from now; 0: nothing.
	capRate float64
}

// observe tells every estimator of the answer, in the order the model's
// transitions read them after.
func (m *hostModel) observe(s *sample) {
	m.gaps.observe(s)
	m.loads.observe(s)
	m.ctl.observe(s)
	m.run.observe(s)
}
