package retryhttp

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Signal is what an answer says of its host; the Transport gives one to
// Limiter.Learn for every attempt whose Reservation asked for it (Report),
// and for every answer that failed or announced a quota. The zero Signal
// (but for Now) says nothing, and asks for the host's status.
type Signal struct {
	Now time.Time
	// Ticket is the Reservation's, given back: which attempt this is.
	Ticket uint64
	// Latency is how long the attempt took, from its send to its answer's
	// headers.
	Latency time.Duration
	// Status is the answer's status; 0 when the attempt got none.
	Status int
	// Refused is set for an answer that says the host will not take the
	// request now: a 429, or a 503 or 529 that names no wait.
	Refused bool
	// Wait is the wait a refusal named (a 429's Retry-After): the host takes
	// at least one request per Wait.
	Wait time.Duration
	// Failed is set when the attempt got no answer (a transport error);
	// Unreachable too when no connection could be made at all.
	Failed, Unreachable bool
	// Err is the attempt's error, for the host's status; nil with a Status.
	Err error
	// Canceled is set when the attempt said nothing of the host: its
	// caller's context ended it, or it was never sent.
	Canceled bool
	// Limit is the quota the host announces (X-RateLimit-Limit,
	// RateLimit-Policy), 0 when none; Window the time it is granted over
	// when the host says so, else 0; Reset the time until the quota is
	// whole again, -1 when not said; Remaining what is left of it, -1 when
	// not said.
	Limit     int
	Window    time.Duration
	Reset     time.Duration
	Remaining int
	// Sent is how many attempts the process sent in the last second, to
	// every host: a bound on what this host got before it had a record.
	Sent float64
	// InFlight is how many attempts the process has on their way, to
	// every host, as the answer comes (its own not counted): a bound on
	// what this host still has of ours before it had a record.
	InFlight int
	// Down is set, for a Limiter given with WithLimiter, when the
	// Transport's own host model holds the host down after this answer:
	// a Limiter that shares it (redislimit does) hands the host back to
	// every process, but for one probe at a time, until an answer gets
	// through. An answer told with Down nil that got through clears it.
	Down *HostDownError
}

// outcome is what an answer says of its host, for the model.
type outcome uint8

const (
	saysNothing outcome = iota
	accepted            // served, the request done
	served              // served, and failed: the host's application answered (a 500)
	refused             // refused for now: a 429, a 503 or 529 naming no wait
	failed              // nothing served: a 502 or 504, or no answer at all
)

func (s *Signal) outcome() outcome {
	switch {
	case s.Canceled:
		return saysNothing
	case s.Refused:
		return refused
	case s.Failed || noOrigin(s.Status):
		return failed
	case s.Status == http.StatusServiceUnavailable || s.Status == statusOverloaded:
		// Naming a wait: the host parks itself, which says nothing more.
		return saysNothing
	case s.Status >= 500 || s.Status == http.StatusRequestTimeout:
		return served
	case s.Status == 0 && s.Limit == 0:
		return saysNothing // a question, not an answer
	}
	return accepted
}

// noOrigin reports a status by which a gateway says the origin gave no
// answer: 502 and 504, and Cloudflare's 520 to 523 (an empty or malformed
// answer, a connection refused, timed out, or no route to it). Nothing was
// served: a host answering only these is down, not failing.
func noOrigin(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusGatewayTimeout || (status >= 520 && status <= 523)
}

// limits reports a refusal by which the host says it limits the rate: a
// 429, or a 403 that refuses for a quota (as GitHub sends).
func (s *Signal) limits() bool {
	return s.Refused && (s.Status == http.StatusTooManyRequests || s.Status == http.StatusForbidden || s.Wait > 0)
}

// statusOverloaded is Anthropic's "overloaded", a 503 of its own.
const statusOverloaded = 529

// describe is a failure as HostDownError.Last says it.
func (s *Signal) describe() string {
	if s.Status >= firstFailureLine && s.Status < firstFailureLine+len(failureLines) {
		return failureLines[s.Status-firstFailureLine]
	}
	if s.Status != 0 {
		return fmt.Sprintf("%d %s", s.Status, http.StatusText(s.Status))
	}
	if s.Err != nil {
		return logError(s.Err)
	}
	return "no answer"
}

// failureLines are describe's lines of the statuses from
// firstFailureLine on, made once and never changed: a host with a record
// has one made at every failure of a run, and fmt took as long as the
// rest of learning the answer, with three allocations.
var failureLines = func() (lines [200]string) {
	for i := range lines {
		code := firstFailureLine + i
		lines[i] = strconv.Itoa(code) + " " + http.StatusText(code)
	}
	return lines
}()

const firstFailureLine = 400
