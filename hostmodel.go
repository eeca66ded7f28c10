package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// The host model: what each host's answers say of it, one state machine per
// host, kept by the in-process Limiter (a Limiter of another kind may keep
// it elsewhere). The Transport reads each answer (observe, at the end of
// this file) and tells the Limiter what it got (Learn); the Limiter holds
// what follows until the next answer: a pace, a limit on what is in flight,
// a host handed back at once.
//
// A host is in one of five states:
//
//	Healthy     nothing is known against it: no record, no cost. Every
//	            host starts here, and returns here once forgotten.
//	Failing     some answers fail, and load does not explain it (a broken
//	            replica, a flaky gateway, one broken endpoint): it is
//	            retried at full speed and never slowed.
//	Overloaded  its refusals grow with what it is sent (a rate limit,
//	            announced or not, or a limit on what it serves at once):
//	            it is paced at what it accepts, as a rate or as a limit on
//	            what is in flight, and the pace grows back while it binds
//	            and the host answers well.
//	Down        nothing gets through (an outage, a dead address): a
//	            request is handed back at once with ErrHostDown, but for one
//	            probe at a time, every probeEvery.
//	Recovering  back from Down: paced at what it took before the outage, so
//	            that the callers' backlog is not flushed at it; the pace
//	            grows while it binds, and goes once it holds nothing back.
//
// The transitions, each named where it is made:
//
//	fail      Healthy → Failing             a failure that load does not explain
//	overload  Healthy, Failing → Overloaded a refusal that load explains (below)
//	checkCut  Overloaded → Failing          a cut that bound did not move the share
//	                                        refused: chance, not load (a host paced
//	                                        before keeps the pace the cut gave it)
//	fall      any → Down                    only failures for downAfter, downFailures
//	                                        of them or more (at once when no
//	                                        connection could be made), in a run
//	                                        the share it failed before makes
//	                                        unlikely (see unlikely)
//	recover   Down → Recovering             an answer gets through (the probe's)
//	settle    Overloaded, Recovering → Healthy  the pace holds nothing back
//	heal      Failing → Healthy             nothing gone wrong for forgetAfter, the
//	                                        record kept (busy, or its latencies kept)
//	forget    any → Healthy                 nothing heard of the host for forgetAfter,
//	                                        or nothing gone wrong for it
//
// A refusal (a 429, a 503 or 529 that names no wait) is explained by load
// when the host says so (a 429), when it came with more in flight than the
// host accepted at once lately (a limit on what is in flight), or when the
// host refused more than it accepted of what it was sent in the last
// second (Google SRE's client-side throttling: requests beyond twice the
// accepts) while more than one attempt was in flight: nothing sent one at a
// time overloads anything. Once a cut has shown that the host refuses a
// share whatever the load, only refusals beyond that share are load. A
// host that announces its quota (X-RateLimit-*,
// RateLimit-*) says what it accepts: it is held to what it says remains,
// until its reset (see quota).

// The model's constants, each with its reason.
const (
	// downAfter is how long only failures make a host down. A host that
	// serves as little as one request a second lets one through in that
	// time; a host slower than that says so with a Retry-After, which
	// parks it instead.
	downAfter = time.Second
	// downFailures is the fewest failures in a row that make a host down:
	// the tries of one request with the default attempts, so that a single
	// failed request never takes a host off line.
	downFailures = 3
	// downRun is a run of failures that makes a host down without waiting
	// for downAfter, when each was sent after the one before was answered:
	// a host failing half its answers at random does that once in a
	// thousand runs. (A burst refused at once is not such a run: an
	// overloaded host refuses one.)
	downRun = 10
	// unlikely is how rare a run of failures must be, for the share of
	// answers the host failed before it, to make the host down: one in a
	// million. Taking a host that fails at random for down hands back
	// every request for a while, so the run must be one that its failures
	// make a few times a day at a thousand requests a second, with room
	// for the share to read low. A host that failed nothing needs
	// downFailures; one that fails 30% of its answers, 12; 60%, 28.
	unlikely = 1e-6
	// failMemory is how many answers the share of failures remembers (an
	// exponentially weighted mean): enough to read 80% within a tenth,
	// few enough that a host which got better is seen to within seconds.
	failMemory = 50
	// freshShare is the share of failures taken for a host that gave too
	// few answers to know its own, when its first answers fail: a quarter,
	// so that a host answering 503 to everything from its first request is
	// down after a run of 10 (one that refused every connection, after
	// downFailures), and one failing 80% at random from its first is taken
	// for down one time in eight, until its next probe gets through.
	freshShare = 0.25
	// probeEvery is how often a down host is tried: its return is seen
	// within half a second, and a dead address costs two connection
	// attempts a second whatever the callers ask.
	probeEvery = 500 * time.Millisecond
	// overloadRatio is Google SRE's K: a host that accepted less than
	// 1/overloadRatio of what it was sent is over its capacity (SRE book,
	// "Handling Overload", client-side throttling).
	overloadRatio = 2
	// cutShare is what a cut keeps of what the host accepted: below it,
	// so that a queue that built up drains.
	cutShare = 0.9
	// nearShare is how close to the rate it refused a pace grows before it
	// stays a while: half way between the cut and the refusal.
	nearShare = (1 + cutShare) / 2
	// hold is how long the evidence of one change is awaited before the
	// next: the window of most rate limits. No pace is cut twice, or grown,
	// within it, and a pace is never cut below one attempt per hold.
	holdTime = time.Second
	// probeStep is the first step past the rate last refused, once the pace
	// has stayed just below it for 2 holds; each next step is three times
	// the last, so a host whose capacity rose is found within seconds.
	probeStep = 0.05
	// forgetAfter is how long a host that nothing went wrong with, or that
	// nothing was asked of, keeps its record: then it is Healthy again.
	forgetAfter = time.Minute
	// horizon is how far ahead a learned pace hands out its slots: a
	// request asks again after it, so that requests already waiting get a
	// pace that has grown meanwhile.
	horizon = 250 * time.Millisecond
)

// HostState is what a host's answers say of it; see HostStatus.
type HostState uint8

// The states of a host.
const (
	// HostHealthy: nothing is known against the host; it is not paced.
	HostHealthy HostState = iota
	// HostFailing: some answers fail whatever the load; retried at full
	// speed, never paced.
	HostFailing
	// HostOverloaded: refusals grow with what is sent; paced at what the
	// host accepts, as a rate or a limit on what is in flight.
	HostOverloaded
	// HostDown: nothing gets through; requests are handed back at once with
	// ErrHostDown, but for a probe every half second.
	HostDown
	// HostRecovering: back from down, paced at what it took before until
	// the pace holds nothing back.
	HostRecovering
)

func (s HostState) String() string {
	switch s {
	case HostHealthy:
		return "healthy"
	case HostFailing:
		return "failing"
	case HostOverloaded:
		return "overloaded"
	case HostDown:
		return "down"
	case HostRecovering:
		return "recovering"
	}
	return fmt.Sprintf("HostState(%d)", uint8(s))
}

// HostStatus is what a Limiter knows of one host: its state, since when,
// and how it is held.
type HostStatus struct {
	State HostState
	// Since is when the host entered State; zero for a host never heard of.
	Since time.Time
	// Pace is the pace learned for the host; unlimited when none. The
	// configured pace (WithPace, WithHostPace) applies besides.
	Pace Pace
	// InFlight is the learned limit on attempts in flight to the host; 0
	// when none.
	InFlight int
	// Retry is, for a down host, when it is tried next.
	Retry time.Time
	// Host is the host, as the Transport keys it (lower case host[:port],
	// without the scheme's default port). Set by Transport.Hosts and
	// Transport.HostStatus; empty from a Limiter's Learn.
	Host string
	// ParkedUntil is when the host's parking ends; zero when it is not
	// parked. Set by Transport.Hosts.
	ParkedUntil time.Time
	// ForgetAt is when the in-process limiter forgets the host at the
	// latest if nothing more is heard of it (sooner once nothing went
	// wrong with it for a minute, or under the bound on hosts); its entry
	// is freed by the next sweep of its shard, within 10 s after while
	// requests come. Set by Transport.Hosts.
	ForgetAt time.Time
}

// ErrHostDown is the errors.Is target for a request handed back at once,
// without being sent, because its host is down: nothing got through to it
// lately. The host is tried again every half second, with one request.
var ErrHostDown = errors.New("retryhttp: host down")

// HostDownError is the detail behind ErrHostDown: which host, since when it
// failed, what it last answered, and when it is tried next.
type HostDownError struct {
	Host  string
	Since time.Time // when its run of failures began
	Last  string    // the last failure: a status ("503 Service Unavailable") or an error
	Retry time.Time // when the next request is let through to try it
}

// Error names the host, since when it failed, how, and when it is tried
// next.
func (e *HostDownError) Error() string {
	s := "retryhttp: host " + e.Host + " down"
	if !e.Since.IsZero() {
		s += " since " + e.Since.UTC().Format(time.RFC3339Nano)
	}
	if e.Last != "" {
		s += " (" + e.Last + ")"
	}
	return s + "; tried again at " + e.Retry.UTC().Format(time.RFC3339Nano)
}

// Unwrap returns ErrHostDown.
func (e *HostDownError) Unwrap() error { return ErrHostDown }

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
	// KeepLatency asks the Limiter to keep the host's answer latencies,
	// for Reservation.Latency: the Transport learns its hedge delay.
	KeepLatency bool
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
	if s.Status != 0 {
		return fmt.Sprintf("%d %s", s.Status, http.StatusText(s.Status))
	}
	if s.Err != nil {
		return logError(s.Err)
	}
	return "no answer"
}

// hostModel is what the in-process limiter knows of one host that failed,
// refused or announced a quota. It is guarded by its shard's lock.
type hostModel struct {
	gen         uint32 // tells this record's tickets from an earlier one's
	state       HostState
	since       time.Time
	seen        time.Time // last asked or answered
	lastTrouble time.Time // last refusal or failure
	lastLoad    time.Time // last refusal that load explained

	// What went out and came back.
	inflight     int    // attempts with a ticket, sent and not answered
	seq          uint32 // tickets handed out
	sent         sliding
	accepts      sliding // answers not refused, with or without a ticket
	refusals     sliding
	okLoad       twoSeconds // the most in flight at the send of an accepted attempt
	answered     time.Time  // when the last answer came, and when it was sent
	answeredSent time.Time
	held         bool    // it served an attempt of ours while it refused others
	exShare      float64 // the share it refused after cuts that did not lower it
	timing       bool    // its latencies are kept, for a Transport that hedges
	ghosts       float64 // attempts sent before the record, still on their way, at most (while fresh)
	latencies    latencies

	// The run of failures that may make the host down.
	streak      int
	streakFrom  time.Time
	streakSeq   uint32 // the first ticket sent after the run began
	older       int    // attempts sent before the run began, still in flight: they may yet succeed
	reachable   bool   // some failure of the run had a connection
	together    bool   // some failure of the run was of an attempt sent while another was on its way
	lastFailure string
	rateBefore  float64 // what the host accepted in the second before the run
	ctlBefore   control // how it was held before the run
	failShare   float64 // the share of its answers that failed, over about failMemory
	tallied     int     // answers in failShare, up to failMemory
	knownBefore int     // tallied before the run
	shareBefore float64 // failShare before the run

	ctl  control
	down outage
	q    quota

	// The requests waiting for a slot in flight, in the order they came,
	// and those a slot is kept for (queue.go).
	queue []*waiter
	kept  []*waiter
}

// control is how an overloaded or recovering host is held: a rate, or a
// limit on what is in flight, and what the model knows of where the host
// refuses.
type control struct {
	rate       float64 // attempts a second; 0: no pace
	burst      int
	limit      int     // attempts in flight; 0: no limit
	ceil       float64 // what the host accepted when it last refused (a rate, or a count in flight); 0: unknown
	step       float64 // the next step past ceil
	holdUntil  time.Time
	grownAt    time.Time
	nearAt     time.Time // when the pace reached just below ceil
	busyAt     time.Time // when a request last waited for the pace or a slot
	burstCut   bool      // the last cut was of a burst sent before the host had a record
	notBefore  time.Time // the pace's first slot after that cut
	guess      int       // what the host took at once in that burst: a limit in flight to try
	tried      bool      // the guess was tried
	before     float64   // the rate to return to when a limit in flight is refuted, and its ceil
	beforeCeil float64
	acked      int // accepted answers since the limit last grew
	cutAt      time.Time
	cutBefore  [2]float64 // the answers before the cut, and the refusals among them
	lowered    [2]float64 // the answers since a cut that lowered the share refused, and the refusals
	cutBound   bool       // the pace bound since the cut
	cutAnswers float64    // answers to attempts sent since the cut, and the refusals among them
	cutRefused float64
	cutFrom    float64 // the pace before the cut; 0: none
}

// outage is what a down host's record keeps.
type outage struct {
	next       time.Time // the next probe
	turnedAway sliding   // what the callers asked while it was down
	oldRate    float64   // what it accepted before its run of failures
	oldCtl     control   // how it was held before the run
}

// admitDown lets a probe go once every probeEvery, and hands every other
// attempt back at once.
func (m *hostModel) admitDown(host string, now time.Time) Reservation {
	d := &m.down
	if !now.Before(d.next) {
		d.next = now.Add(probeEvery)
		return Reservation{OK: true, Report: true, Ticket: m.send(now)}
	}
	d.turnedAway.add(now, 1)
	return Reservation{Down: &HostDownError{Host: host, Since: m.streakFrom, Last: m.lastFailure, Retry: d.next}}
}

// quota is what a host announces it grants: limit per window, remaining
// until reset. A host whose reset moment moves between answers refills as
// it goes (a sliding window, a token bucket): it is held to what remains
// and refilled at limit per window; any other is held to what remains
// until its reset, then grants limit again.
//
// A reset does not say which kind the window is: a fixed one is whole
// again, a sliding count still counts most of the window before (and
// refuses a burst at its reset, often with a Retry-After of a whole
// window). Until the first answer after a reset tells, the window grants
// one attempt a slack after the reset, then its average rate (probing): a
// fixed one costs a round trip, once, and a sliding one is never sent the
// burst it refuses.
type quota struct {
	limit     int
	window    time.Duration // said (RateLimit-Policy's w), or the longest reset seen
	remaining int           // what the last answer said, less what was in flight then
	taken     int           // attempts sent since that answer
	at        time.Time     // when that answer came
	resetAt   time.Time     // when it is whole again; zero: not said
	rolled    bool          // a reset passed since the announcement: since counts from it
	since     int           // attempts sent since that reset
	sliding   bool
	fixed     bool      // whole again after a reset: it grants its limit at once
	probing   bool      // a reset passed, and no answer since told its kind
	named     time.Time // the moment the last refusal named as its wait
	counts    bool      // it slides, with a reset that stays put: a count of the window before, not a bucket
	restarts  bool      // seen whole again within half a window of spent: a window that starts anew
	said      int       // the remaining the last answer said, as said
	saidReset time.Time // and the reset it said; zero: none
	saidAt    time.Time // and when it came
	// When the quota is first announced, or its window first seen to
	// slide, what it said remains: the pace's burst is charged with what
	// the host still counts, once.
	syncAt   time.Time
	syncLeft int
	renewed  bool // it replaced another announcement: the old pace's schedule goes
	// The fewest said to remain since lowFrom, and whether no answer of
	// the last whole window said less than half the limit remains
	// (spare): a host that stays more than half full under a pace that
	// binds gives back faster than it is asked, more than its
	// announcement says (throttled announces a bucket's burst as its
	// limit, and the time to fill it as its reset). A window or count
	// paced at its rate runs down to its last few.
	low     int
	lowFrom time.Time
	spare   bool
	beyond  bool // spare was seen under a pace that bound: the announced rate is a floor, not a cap
	deep    bool // an answer said more remain than the limit
}

// watchSpare takes in what an answer says remains.
func (q *quota) watchSpare(left int, now time.Time) {
	if q.lowFrom.IsZero() {
		q.low, q.lowFrom = left, now
		return
	}
	q.low = min(q.low, left)
	// More left than the limit after a request: the limit is the rate of
	// a deeper bucket (tollbooth says its rate, and its tokens left), and
	// the rate it says is the rate.
	q.deep = q.deep || left >= q.limit
	if now.Sub(q.lowFrom) >= max(q.window, holdTime) {
		q.spare = !q.deep && q.low >= 1 && 2*q.low >= q.limit
		q.low, q.lowFrom = left, now
	}
}

func (q *quota) active() bool { return q.limit > 0 }

// perSecond is the rate the quota allows, 0 when its window is unknown.
func (q *quota) perSecond() float64 {
	if q.window <= 0 {
		return 0
	}
	return float64(q.limit) / q.window.Seconds()
}

// paceRate is the rate a host is paced at by its quota: perSecond, but
// one fewer a window for a sliding count (a window that slides while its
// reset stays put: the last window's count weighted, plus this one's) of
// more than resetSlack. Such a count rounds, and refuses at its limit
// whenever the pace's phase falls early in its window, for the rest of
// the window or the whole of it (httprate names its window as the
// Retry-After): one attempt in limit is the price of never losing more
// than a second. A token bucket (its reset moves) takes its rate.
//
// A window seen to start anew (restarts) is stretched by paceMargin: a
// pace of exactly limit a window sends the attempt after a window's limit
// at the very instant the window ends, where a window that starts at its
// first request (ulule's, most INCR-and-EXPIRE counters) still counts
// it. Refused there, its request goes to the back of the queue and can
// meet the next such instant: two tries lost to the phase of a pace. A
// sliding count is not stretched: at exactly its rate it holds the same
// count at every attempt, and a pace a hair slower drifts into the
// instants after its windows start, where it refuses.
func (q *quota) paceRate() float64 {
	switch {
	case q.restarts:
		return float64(q.limit) / (q.window + q.window/paceMargin).Seconds()
	case q.counts && q.window > resetSlack && q.limit > 1:
		return float64(q.limit-1) / q.window.Seconds()
	}
	return q.perSecond()
}

// spareGrowth is how much a pace grows each hold past an announced rate
// while the host says it has more (quota.spare).
const spareGrowth = 1.25

// paceMargin stretches a restarting window for its pace by one part in
// paceMargin: 10 ms a second, more than a loopback's or a LAN's jitter,
// for 1% of the rate.
const paceMargin = 100

// tokens is how many attempts the quota lets go at now.
func (q *quota) tokens(now time.Time) float64 {
	if !q.resetAt.IsZero() && !now.Before(q.resetAt) {
		q.roll(now)
	}
	t := float64(q.remaining)
	switch {
	case q.sliding:
		t = min(float64(q.limit), t+now.Sub(q.at).Seconds()*q.perSecond())
	case q.probing:
		// One at the reset, then the average rate.
		t = 0
		if since := now.Sub(q.at.Add(q.slack())); since >= 0 {
			t = min(float64(q.remaining), 1+math.Floor(since.Seconds()*q.perSecond()+tokenSlack))
		}
	}
	return t - float64(q.taken)
}

// roll starts the window after the reset: whole again.
func (q *quota) roll(now time.Time) {
	if !q.probing {
		q.at = q.resetAt // a window still untold keeps its grants from the first reset
	}
	q.remaining, q.taken, q.since, q.rolled = q.limit, 0, 0, true
	q.probing = !q.fixed && !q.sliding && q.limit > 1 && q.perSecond() > 0
	switch {
	case q.window <= 0:
		q.resetAt = time.Time{}
	default:
		// The resets to come, a window apart, the first after now.
		n := now.Sub(q.resetAt)/q.window + 1
		q.resetAt = q.resetAt.Add(n * q.window)
	}
}

// resetSlack is how late a reset may come after the moment said: headers
// say it in whole seconds, and a Unix time is truncated to one.
const resetSlack = time.Second

// slack is how long after the reset said the first grant of a window of
// unknown kind waits: none when a refusal named that very moment as its
// wait (a spent quota's reset), as the host asked to be asked then;
// resetSlack for a window longer than that, whose reset, said in whole
// seconds, may come up to a second late, and where an attempt a moment
// early can be refused for the whole window (httprate names its window as
// every refusal's Retry-After: a burst refused as a window opens is told
// to come back as the next opens, where the count still refuses it); an
// interval for a shorter one, as a sliding count refuses at its reset
// what it counted of the window before. A Retry-After that ends later
// holds the host (it is parked) until then anyway.
func (q *quota) slack() time.Duration {
	switch {
	case !q.named.IsZero() && absDuration(q.named.Sub(q.at)) < time.Millisecond:
		return 0
	case q.window > resetSlack:
		return resetSlack
	}
	return time.Duration(float64(time.Second) / q.perSecond())
}

// tokenSlack absorbs the rounding of a quota's refill, so that a token all
// but whole is whole.
const tokenSlack = 1e-9

// nextToken is when the quota next lets an attempt go, when it lets none
// go at now; zero when nothing is known to refill it.
func (q *quota) nextToken(now time.Time) time.Time {
	missing := 1 - q.tokens(now) - tokenSlack
	if q.sliding && q.perSecond() > 0 {
		wait := time.Duration(math.Ceil(missing / q.perSecond() * float64(time.Second)))
		at := now.Add(max(wait, time.Microsecond))
		if !q.resetAt.IsZero() && at.After(q.resetAt) {
			return q.resetAt
		}
		return at
	}
	if q.probing {
		// The next grant at the average rate from the reset, unless the
		// window's kind is told before it.
		wait := time.Duration(float64(q.taken) / q.perSecond() * float64(time.Second))
		if at := q.at.Add(q.slack() + wait); at.After(now) {
			return at
		}
		return now.Add(time.Microsecond)
	}
	return q.resetAt
}

// quotaWait says whether the quota lets no attempt go at now, and until
// when. While the record is fresh, the attempts of the burst that made it,
// still on their way, are counted against what remains (up to a quota's
// worth, and no longer than the record is fresh: a busy process's other
// traffic is not this host's).
func (m *hostModel) quotaWait(now time.Time) (time.Time, bool) {
	if m.q.sliding && m.q.perSecond() > 0 {
		// A window that slides gives back as it goes, at the rate it
		// announces: the pace keeps to it (what it says remains lags a
		// sliding count, and hovers at none for a client at its rate).
		return time.Time{}, false
	}
	tokens := m.q.tokens(now) + tokenSlack
	if tokens < 1 {
		// Spent, until the moment it names; a host that names none is
		// asked, and says so again.
		at := m.q.nextToken(now)
		return at, !at.IsZero()
	}
	if m.fresh(now) && tokens-min(m.ghosts, float64(m.q.limit)) < 1 {
		return m.since.Add(holdTime), true
	}
	return time.Time{}, false
}

// learnQuota takes in what an answer announces.
func (m *hostModel) learnQuota(l *localLimiter, host string, sig *Signal) {
	q, now := &m.q, sig.Now
	window := sig.Window
	if window <= 0 {
		// Not said: the longest reset seen (an answer at its reset says
		// nothing of the window).
		if sig.Limit == q.limit {
			window = q.window
		}
		if sig.Reset > 0 {
			window = max(window, sig.Reset.Round(time.Second), time.Second)
		}
	}
	if q.limit != sig.Limit || (sig.Window > 0 && q.window != sig.Window) {
		// A new announcement replaces the old, and so does the pace's
		// schedule of the old: slots a pace of 5000 an hour handed out
		// mean nothing to one of 30 a minute (syncQuota).
		renewed := q.active()
		*q = quota{renewed: renewed}
		l.log(host, "retryhttp: quota", slog.Int("limit", sig.Limit), slog.String("window", window.String()))
		if sig.Remaining >= 0 {
			// What was sent before the host said its quota is spent from
			// the pace's burst too, once: a burst sent before any answer
			// was not paced.
			q.syncAt, q.syncLeft = now, max(sig.Remaining-m.inflight, 0)
		}
	}
	q.limit, q.window = sig.Limit, window
	if sig.Refused && sig.Wait > 0 {
		q.named = now.Add(sig.Wait)
	}
	if !q.resetAt.IsZero() && !now.Before(q.resetAt) {
		q.roll(now) // the answer is of the window after the reset
	}
	// A window that slides (a sliding count, a token bucket) gives back as
	// it goes; a fixed one only at its reset. The host shows which: a fixed
	// window names the same moment until it ends (in whole seconds, as the
	// headers say it), and is whole again after it.
	if sig.Reset >= 0 {
		resetAt := now.Add(sig.Reset)
		switch {
		case q.resetAt.IsZero() || !now.Before(q.resetAt):
			q.resetAt = resetAt
		case absDuration(resetAt.Sub(q.resetAt)) > time.Second:
			q.sliding, q.counts = true, false // the moment moved within the window: a bucket
			q.resetAt = resetAt
		case resetAt.Before(q.resetAt) && sig.Reset > 0:
			// Said in whole seconds, counted from a Date in whole
			// seconds, the moment comes late by up to a second: the
			// earliest said is the nearest. A reset of 0 s says only
			// that it falls within the second, not that it is now.
			q.resetAt = resetAt
		}
	}
	if sig.Remaining >= 0 && q.rolled {
		// Not whole after its reset: it counts the window before.
		if !q.sliding && sig.Remaining < q.limit-q.since {
			q.sliding, q.counts = true, true
			q.syncAt, q.syncLeft = now, max(sig.Remaining-m.inflight, 0)
		}
		q.fixed = !q.sliding
		q.probing = false
	}
	if sig.Remaining >= 0 {
		q.watchSpare(sig.Remaining, now)
		q.restarted(sig, now)
		// What was in flight when the host counted is taken from it too.
		q.remaining, q.taken, q.at = sig.Remaining-m.inflight, 0, now
	}
}

// restarted marks a window seen to start anew: spent, then whole within
// half a window, with a reset a window later. Neither a bucket nor a
// sliding count gives back more than its rate in the time between, and
// answers out of order are of one window (the same reset) or say an
// earlier reset after a later one.
func (q *quota) restarted(sig *Signal, now time.Time) {
	var resetAt time.Time
	if sig.Reset >= 0 {
		resetAt = now.Add(sig.Reset)
	}
	if q.said <= 1 && sig.Remaining >= q.limit-1 && q.limit > 2 && now.Sub(q.saidAt) < q.window/2 &&
		!q.saidReset.IsZero() && !resetAt.IsZero() && resetAt.Sub(q.saidReset) >= q.window/2 {
		q.restarts = true
	}
	q.said, q.saidReset, q.saidAt = sig.Remaining, resetAt, now
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// newModel starts the record of a host at its first failure, refusal or
// announcement.
func newModel(gen uint32, now time.Time) *hostModel {
	return &hostModel{gen: gen, since: now, seen: now}
}

// ticket is a reservation's stamp: the record it belongs to, the attempt's
// sequence number, and how many were in flight with it, itself included.
func ticket(gen, seq uint32, load int) uint64 {
	return uint64(gen)<<40 | uint64(seq)<<8&(1<<40-1) | uint64(min(load, 255))
}

func ticketParts(t uint64) (gen, seq uint32, load int) {
	return uint32(t >> 40), uint32(t>>8) & (1<<32 - 1), int(t & 255)
}

// send counts an attempt the limiter let go, and returns its ticket.
func (m *hostModel) send(now time.Time) uint64 {
	m.seq++
	m.inflight++
	m.sent.add(now, 1)
	m.seen = now
	return ticket(m.gen, m.seq, m.inflight)
}

// release takes an answered (or unsent) attempt out of what is in flight,
// and says whether it was one of this record's, with its load and sequence.
func (m *hostModel) release(t uint64) (tracked bool, load int) {
	gen, seq, load := ticketParts(t)
	if t == 0 || gen != m.gen {
		return false, 0
	}
	m.inflight = max(m.inflight-1, 0)
	if m.streak > 0 && seq < m.streakSeq {
		m.older = max(m.older-1, 0)
	}
	return true, load
}

// acked1 grows a limit in flight below what the host took at once by one
// for every limit's worth of accepted answers, while requests wait for it.
func (c *control) acked1(now time.Time) {
	if c.limit == 0 || float64(c.limit) >= c.ceil-1 || now.Sub(c.busyAt) >= holdTime {
		return
	}
	if c.acked++; c.acked >= c.limit {
		c.limit, c.acked = c.limit+1, 0
		if float64(c.limit) >= c.ceil-1 {
			c.nearAt = now
		}
	}
}

// answer takes in what an attempt got, and makes the transition it calls
// for. It is the model's one entry for answers.
func (m *hostModel) answer(sig *Signal, l *localLimiter, host string) {
	now := sig.Now
	tracked, load := m.release(sig.Ticket)
	defer m.wake(now) // a slot freed, or a limit changed: the waiters first
	if !tracked && !sig.Canceled && (sig.Status != 0 || sig.Failed) {
		m.ghosts = max(m.ghosts-1, 0)
	}
	if sig.Limit > 0 {
		m.learnQuota(l, host, sig)
	}
	o := sig.outcome()
	if o == saysNothing {
		return
	}
	m.seen = now
	m.timing = m.timing || sig.KeepLatency
	// Sent while another was on its way: before the last answer came, or
	// with the attempt that brought it.
	sentAt := now.Add(-sig.Latency)
	overlapped := load > 1 || (!tracked && (sentAt.Before(m.answered) || sentAt.Equal(m.answeredSent)))
	m.answered, m.answeredSent = now, sentAt
	switch o {
	case refused:
		m.refusals.add(now, 1)
	case accepted, served:
		m.accepts.add(now, 1)
	}
	if c := &m.ctl; !c.cutAt.IsZero() && sentAt.After(c.cutAt) && !sig.limits() && o != failed {
		c.cutAnswers++
		if o == refused {
			c.cutRefused++
		}
	}
	if tracked && sig.Latency > 0 && o == accepted {
		m.latencies.add(sig.Latency)
	}
	switch o {
	case accepted, served:
		if tracked && o == accepted {
			m.okLoad.add(now, load)
			m.ctl.acked1(now)
		}
		if !tracked && o == accepted && !sentAt.After(m.since) && now.After(m.since) {
			// Sent before the host first refused, answered after: it
			// held this one while it refused others.
			m.held = true
		}
		m.streak = 0
		m.tally(false)
		if m.state == HostDown {
			m.recover(l, host, now)
		}
		if o == served {
			m.lastTrouble = now
			m.fail(now)
		}
	case refused:
		m.lastTrouble = now
		if !sig.limits() {
			m.failure(sig, overlapped) // a host that says it limits the rate is up
		}
		if m.state == HostDown {
			break
		}
		if !sig.limits() {
			m.tally(true)
		}
		if m.explained(sig, overlapped) {
			m.overload(l, host, sig, tracked, load, overlapped)
		} else {
			m.fail(now)
		}
	case failed:
		m.lastTrouble = now
		m.failure(sig, overlapped)
		if m.state != HostDown {
			m.tally(true)
			m.fail(now)
		}
	}
	if m.state != HostDown && m.falls(now) {
		m.fall(l, host, now)
	}
	m.heal(now)
}

// heal: Failing → Healthy, once nothing went wrong for forgetAfter. A
// record kept while the host is busy (requests always in flight, or its
// latencies kept for hedging) is not forgotten, so the state must mend in
// place.
func (m *hostModel) heal(now time.Time) {
	if m.state == HostFailing && now.Sub(m.lastTrouble) >= forgetAfter {
		m.setState(HostHealthy, now)
		m.exShare = 0
	}
}

// fail: Healthy → Failing. A failing host is not slowed.
func (m *hostModel) fail(now time.Time) {
	if m.state == HostHealthy {
		m.setState(HostFailing, now)
	}
}

func (m *hostModel) setState(s HostState, now time.Time) {
	if m.state != s {
		m.state, m.since = s, now
	}
}

// failure adds an answer that got nothing through to the run that may make
// the host down.
func (m *hostModel) failure(sig *Signal, overlapped bool) {
	if m.streak == 0 {
		m.streakFrom, m.streakSeq, m.reachable, m.together = sig.Now, m.seq+1, false, false
		// Attempts sent before this one, still in flight, may yet get
		// through: the host is not down while they may.
		m.older = m.inflight
		// What the host took before the run, to be paced at when it comes
		// back; for a record just made, the process's rate bounds it.
		m.rateBefore = m.accepts.lastSecond(sig.Now)
		if m.fresh(sig.Now) {
			m.rateBefore = max(m.rateBefore, sig.Sent)
		}
		// What the run does to the pace is not what the host took: the
		// run may be an outage's first seconds, taken for overload.
		m.shareBefore, m.knownBefore, m.ctlBefore = m.failShare, m.tallied, m.ctl
	}
	m.streak++
	m.reachable = m.reachable || !sig.Unreachable
	m.together = m.together || overlapped
	m.lastFailure = sig.describe()
}

// falls reports whether the run of failures makes the host down: nothing
// got through, nothing sent before the run is still on its way, and the
// run is long enough: downFailures when no connection could be made at
// all, or over downAfter; downRun when each was sent after the last was
// answered.
func (m *hostModel) falls(now time.Time) bool {
	need := m.runNeeded()
	if m.streak < need || m.older > 0 {
		return false
	}
	span := now.Sub(m.streakFrom)
	return !m.reachable || span >= downAfter || (m.streak >= max(downRun, need) && !m.together && span > 0)
}

// runNeeded is the shortest run of failures that makes the host down: a
// run its share of failures before the run makes unlikely.
func (m *hostModel) runNeeded() int {
	f := m.shareBefore
	if m.knownBefore < downFailures && m.reachable {
		// Too few answers before the run to know its share: failures that
		// had a connection may be a flaky host's first. Connections refused
		// from the first are a dead address.
		f = freshShare
	}
	if f <= 0 {
		return downFailures
	}
	if f >= 1-1/float64(failMemory) {
		f = 1 - 1/float64(failMemory) // it failed all it remembers: one run of the memory's length
	}
	return max(downFailures, int(math.Ceil(math.Log(unlikely)/math.Log(f))))
}

// tally adds an answer to the share of answers that failed.
func (m *hostModel) tally(failed bool) {
	x := 0.0
	if failed {
		x = 1
	}
	// The mean of the answers so far, until there are failMemory of them:
	// a share that starts at 0 would read a host failing from its first
	// answers as one that fails little.
	m.tallied = min(m.tallied+1, failMemory)
	m.failShare += (x - m.failShare) / float64(m.tallied)
}

// fall: any → Down. The host is handed back at once but for its probes,
// one every probeEvery; requests waiting for a slot in flight learn of it.
func (m *hostModel) fall(l *localLimiter, host string, now time.Time) {
	m.down = outage{next: now.Add(probeEvery), oldRate: m.rateBefore, oldCtl: m.ctlBefore}
	m.failShare = m.shareBefore // what the host failed before it was down
	m.setState(HostDown, now)
	m.wake(now)
	l.log(host, "retryhttp: host down", slog.String("since", m.streakFrom.UTC().Format(time.RFC3339Nano)),
		slog.String("last", m.lastFailure))
}

// recover: Down → Recovering, at the rate the host took before, or what
// the callers asked of it meanwhile when that is less; its old pace, if it
// had one, when it was overloaded.
func (m *hostModel) recover(l *localLimiter, host string, now time.Time) {
	r := m.down.oldRate
	if asked := m.down.turnedAway.lastSecond(now); asked > 0 && (r == 0 || asked < r) {
		r = asked
	}
	was := m.down.oldCtl
	m.down = outage{}
	m.streak = 0
	m.ctl = control{step: probeStep}
	if r == 0 && was.rate == 0 && was.limit == 0 {
		// Nothing is known of what it takes: it never served, nor was
		// asked anything meanwhile. It is not held back on a guess.
		m.setState(HostFailing, now)
		l.log(host, "retryhttp: host back", paceAttr("pace", 0))
		return
	}
	if was.rate > 0 || was.limit > 0 {
		m.ctl.rate, m.ctl.limit, m.ctl.ceil = was.rate, was.limit, was.ceil
	} else {
		m.ctl.rate = max(r, 1/holdTime.Seconds())
	}
	m.ctl.burst = max(1, int(m.ctl.rate*horizon.Seconds()))
	m.ctl.grownAt, m.ctl.busyAt = now, now
	m.setState(HostRecovering, now)
	l.log(host, "retryhttp: host back", paceAttr("pace", m.ctl.rate))
}

// explained reports whether load explains a refusal (see the package
// comment above): the host says so, or it came with more in flight than
// the host accepted at once, or the host refused more than it accepted of
// a burst.
func (m *hostModel) explained(sig *Signal, overlapped bool) bool {
	now := sig.Now
	if sig.limits() || m.state == HostOverloaded {
		return true
	}
	// A host that refuses a share at random whatever the load (exShare,
	// once cuts showed that) accepts the rest of what it is sent: it is
	// overloaded when it accepts less than 1/overloadRatio of that.
	sent := m.sentLastSecond(sig)
	return overlapped && (1-m.exShare)*sent > overloadRatio*(sent-m.refusals.lastSecond(now))
}

// sentLastSecond is what the host got in the last second: what was counted
// for it, or, until it has been counted a second, what the process sent to
// every host, of which it got at most all.
func (m *hostModel) sentLastSecond(sig *Signal) float64 {
	sent := m.sent.lastSecond(sig.Now)
	if m.fresh(sig.Now) {
		sent = max(sent, sig.Sent, m.accepts.lastSecond(sig.Now)+m.refusals.lastSecond(sig.Now))
	}
	return sent
}

// overload: → Overloaded, and the pace cut to what the host accepts, once a
// hold; or the limit in flight set to what it accepted at once, when it
// refused only beyond that. A refusal of the same burst after a cut may
// lower the pace further, to what it shows was accepted.
func (m *hostModel) overload(l *localLimiter, host string, sig *Signal, tracked bool, load int, overlapped bool) {
	now, c := sig.Now, &m.ctl
	lastLoad := m.lastLoad
	m.lastLoad = now
	// What the host accepted in the last second: the answers that said
	// so, or, for a burst whose accepted answers came before the host had
	// a record, what it got less what it refused.
	sent := m.sentLastSecond(sig)
	accepted := max(sent-m.refusals.lastSecond(now), m.accepts.lastSecond(now), 0)
	if sig.Wait > 0 {
		if m.accepts.lastSecond(now) == 0 && m.refusals.lastSecond(now) <= 1 {
			// The one answer in a second, a refusal with a wait named:
			// the host is spent for that wait (it is parked) by what it
			// was sent before the quiet; it says nothing of its rate.
			m.lastLoad = lastLoad
			return
		}
		accepted = max(accepted, 1/sig.Wait.Seconds())
	}
	if m.state != HostOverloaded && m.state != HostRecovering {
		if sig.Wait <= 0 && !m.q.active() && m.noise(now, sent) {
			// One refusal among many accepted, naming no wait, from a
			// host that announces nothing, says it was full for a moment,
			// not what it takes: a rate is cut at the second refusal
			// within a second, which a limit hit by our traffic sends at
			// once. (A refusal with a wait parks the host; a quota's
			// refusal tells the window's phase: both are read below.)
			m.lastLoad = lastLoad
			return
		}
		m.setState(HostOverloaded, now)
		*c = control{}
	}
	switch {
	case c.limit > 0 && !tracked:
		return // a late answer of an attempt sent before the limit
	case c.limit > 0 && load <= 1:
		// Refused with nothing else in flight: no limit in flight
		// explains that, a rate does.
		c.limit, c.burstCut, c.ceil = 0, false, c.beforeCeil
		if c.before > 0 {
			m.setRate(l, host, c.before, now)
			c.holdUntil, c.grownAt, c.nearAt = now.Add(holdTime), now, now
			return
		}
		m.cutRate(l, host, now, accepted, sent, false, false)
		return
	case c.limit > 0:
		// Refused with others in flight: one fewer at once. A limit one
		// above the host's loses one attempt per slot too many, once.
		c.limit = max(1, c.limit-1)
		c.ceil, c.holdUntil, c.grownAt, c.nearAt = float64(c.limit+1), now.Add(holdTime), now, now
		return
	case now.Before(c.holdUntil):
		if c.burstCut && m.fresh(now) {
			// Each refusal of the burst says more of what the host took
			// of it: the refusal the pace may grow back to.
			c.ceil = min(c.ceil, max(accepted, 1))
		}
		if c.burstCut && m.fresh(now) && c.rate > 0 && cutShare*accepted < c.rate {
			c.guess = min(c.guess, int(math.Round(accepted)))
			if c.guess == 0 && overlapped {
				// The cut came with the burst's first refusal, before
				// it could tell it was a burst (a 429 is explained at
				// once): what the host took of it may be a limit in
				// flight, as in cutRate.
				c.guess, c.notBefore = int(math.Round(accepted)), c.holdUntil
			}
			m.setRate(l, host, max(cutShare*accepted, 1/holdTime.Seconds()), now)
		}
		return
	case m.phaseRefusal(sig, sent):
		m.lastLoad = lastLoad
		return
	case c.rate > 0 && c.rate <= nearShare*c.ceil && m.noise(now, sent):
		m.lastLoad = lastLoad
		return // a lone refusal, among many accepted, at a pace the host took before
	case c.rate > 0 && m.exShare > 0 && !m.beyondChance(now):
		m.lastLoad = lastLoad
		return // refusals at the share it refuses whatever the load
	}
	switch m.checkCut(l, host, now, now.Sub(c.busyAt) < holdTime, holdTime) {
	case undecided:
		m.lastLoad = lastLoad
		return // too few answers since the last cut to tell whether it helped
	case byChance:
		return // the cut a hold ago did not move the share it refuses
	}
	m.cutRate(l, host, now, accepted, sent, m.fresh(now), overlapped)
	if sig.limits() {
		c.cutAt = time.Time{} // the host said it limits the rate: nothing to check
	}
}

// phaseRefusal reports a lone refusal by a sliding count, with a wait
// named, of a pace at the rate the count announces, and moves the pace's
// next slot half an interval off the refused attempt's. Such a count
// holds the same count at each attempt of a pace at its rate, and refuses
// them all or none by where they fall in its intervals: in the first
// half after its window opens, its rounded count reaches the limit. The
// refusal says the pace falls there; half an interval later it falls in
// the other half, whatever the latency to the host (the shift is from
// the refused attempt, on the same path). The rate the host announced
// is kept: cutting it would only bring the pace back to the same phase.
func (m *hostModel) phaseRefusal(sig *Signal, sent float64) bool {
	q, now := &m.q, sig.Now
	r := q.paceRate()
	if p := float64(m.pace().Limit); !q.counts || sig.Wait <= 0 || r <= 0 || m.fresh(now) || !m.noise(now, sent) ||
		p < r*cutShare || p > r/cutShare {
		return false // not a pace at the rate the count announces
	}
	d := time.Duration(float64(time.Second) / r)
	if d > holdTime {
		return false // the shift would add more than a hold to the wait named
	}
	slot := now.Add(-sig.Latency).Add(d / 2)
	if back := now.Add(sig.Wait); slot.Before(back) {
		slot = slot.Add((back.Sub(slot) + d - 1) / d * d)
	}
	m.ctl.notBefore = later(m.ctl.notBefore, slot)
	return true
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fresh reports whether the record is a hold old or less: what it hears
// of is still the burst that made it.
func (m *hostModel) fresh(now time.Time) bool { return now.Sub(m.since) < holdTime }

// beyondChance reports refusals in the last second more than the share
// the host refuses whatever the load (exShare) makes likely: over two
// standard deviations, and one, above it.
func (m *hostModel) beyondChance(now time.Time) bool {
	r := m.refusals.lastSecond(now)
	n, f := r+m.accepts.lastSecond(now), m.exShare
	return r > f*n+2*math.Sqrt(n*f*(1-f))+1
}

// noise reports refusals too few to say the pace is too fast: one in a
// second, among more than overloadRatio times as many sent.
func (m *hostModel) noise(now time.Time, sent float64) bool {
	r := m.refusals.lastSecond(now)
	return r < 2 && r*overloadRatio < sent
}

// cutRate paces the host at cutShare of what it accepted.
func (m *hostModel) cutRate(l *localLimiter, host string, now time.Time, accepted, sent float64, burst, overlapped bool) {
	c := &m.ctl
	target := cutShare * accepted
	if p := m.pace(); !p.Unlimited() {
		target = min(target, cutShare*float64(p.Limit)) // below the pace it refused
	}
	c.ceil, c.burstCut, c.limit = accepted, burst, 0
	switch {
	case burst && overlapped:
		// What the host took of a burst at once may be a limit on what it
		// serves at once, not a rate: tried once it has answered. The
		// burst had what the host grants for now: the pace starts a hold
		// later.
		c.guess = int(math.Round(accepted))
		c.notBefore = now.Add(holdTime)
	case !burst && c.guess == 0:
		c.guess = m.okLoad.max(now) // the most it took at once lately
	}
	c.step, c.holdUntil, c.grownAt, c.nearAt = probeStep, now.Add(holdTime), now, time.Time{}
	if c.cutAt.IsZero() {
		// The first of a run of cuts is checked: did they lower the share
		// refused (exonerated)?
		c.cutAt, c.cutBound, c.cutAnswers, c.cutRefused, c.cutFrom = now, false, 0, 0, c.rate
		c.cutBefore = c.lowered
		if c.cutBefore[0] == 0 {
			r := m.refusals.lastSecond(now)
			c.cutBefore = [2]float64{max(r+m.accepts.lastSecond(now), 1), r}
		}
		c.lowered = [2]float64{}
	}
	m.setRate(l, host, max(target, 1/holdTime.Seconds()), now)
}

// setRate changes the learned pace, and logs a change that matters.
func (m *hostModel) setRate(l *localLimiter, host string, r float64, now time.Time) {
	c := &m.ctl
	old := c.rate
	c.rate, c.burst = r, 1
	if m.state == HostRecovering {
		c.burst = max(1, int(r*horizon.Seconds()))
	}
	if old == r || (old > 0 && r > 0 && r < 2*old && r > old/2) {
		return
	}
	l.logPace(host, old, r)
}

// adjust runs before each attempt: it grows a pace that binds, settles one
// that holds nothing back, tries a guessed limit in flight, and clears a
// host the cut did not help.
func (m *hostModel) adjust(l *localLimiter, host string, now time.Time) {
	c := &m.ctl
	if c.rate == 0 && c.limit == 0 {
		r := m.q.paceRate()
		if !m.q.active() || !m.q.spare || r <= 0 || now.Sub(c.busyAt) >= holdTime {
			return
		}
		// The announced pace binds and the host never ran out: it takes
		// more than it says. The pace is learned from here, and grows
		// while nothing is refused.
		c.step, c.grownAt = probeStep, now
		m.q.beyond = true
		m.setRate(l, host, r, now)
		return
	}
	if m.q.spare && !m.q.beyond && now.Sub(c.busyAt) < holdTime {
		// Held by a pace, the host never ran out for a window: what it
		// took of a burst, and what it announces, are not its rate.
		m.q.beyond, c.ceil, c.nearAt = true, 0, time.Time{}
	}
	every := holdTime
	if m.state == HostRecovering && c.ceil == 0 && c.limit == 0 {
		// Back, and nothing refused since: the pace doubles every horizon
		// while it binds (slow start), so that a host whose old rate was
		// little known is served at what it takes within a second or two.
		every = horizon
	}
	if now.Before(c.holdUntil) || now.Sub(c.grownAt) < every {
		if now.Sub(c.busyAt) < holdTime && !c.cutAt.IsZero() && !c.busyAt.Before(c.cutAt) {
			c.cutBound = true
		}
		return
	}
	defer func() { c.grownAt = now }()
	binds := now.Sub(c.busyAt) < holdTime
	if m.checkCut(l, host, now, binds, 2*holdTime) == byChance {
		return
	}
	switch {
	case binds && c.guess > 1 && !c.tried && m.held && !m.q.active() && c.rate > 0 && m.latencies.n > 0 &&
		float64(c.guess)/m.latencies.p95().Seconds() > c.rate:
		// The burst's share may have been a limit on what the host
		// serves at once (it refused while it served ours; a host that
		// refuses with nothing of ours in hand limits something else):
		// try it, from what the pace has in flight up,
		// one more for every limit's worth of accepted answers (TCP's
		// congestion avoidance), and go back to the rate at the first
		// refusal of an attempt sent alone.
		c.tried, c.before, c.beforeCeil = true, c.rate, c.ceil
		c.limit, c.rate, c.ceil, c.acked = max(m.inflight, 1), 0, float64(c.guess)+1, 0
		l.log(host, "retryhttp: trying limit", slog.Int("in_flight", c.guess))
	case binds && now.Sub(m.lastLoad) >= holdTime:
		m.grow(l, host, now) // failures that load does not explain do not hold it back
	case !binds && now.Sub(m.lastTrouble) >= forgetAfter:
		// settle: the pace holds nothing back, and nothing went wrong for
		// long enough that what was learned is stale.
		l.logPace(host, c.rate, 0)
		m.ctl = control{}
		m.setState(HostHealthy, now)
	}
}

// cutVerdict is what the answers to attempts sent since a cut say of it.
type cutVerdict uint8

const (
	unchecked cutVerdict = iota // no cut awaits its check
	undecided                   // too few answers since the cut to tell
	byLoad                      // the share refused fell, or grew: load explains it
	byChance                    // the share did not move: the host refuses it whatever the load
)

// checkCut is the check of the last cut, at the next cut or two holds
// after it. A cut that bound lowered what was sent; had load caused the
// refusals, the share refused falls; had the cut left the pace past the
// host's capacity, it rises. A share that does neither (the share since
// the cut less than two standard errors below the share before it, and
// not one above; three refusals since at least) is chance: a host that was not paced before is
// failing, not overloaded, and one that was keeps the pace the cut gave
// it. Refusals at that share (exShare) are not taken for load again until
// the record is forgotten. A cut that lowered the share is followed by
// the next with the share since it as what came before: what remains may
// be chance.
func (m *hostModel) checkCut(l *localLimiter, host string, now time.Time, binds bool, after time.Duration) cutVerdict {
	c := &m.ctl
	if c.cutAt.IsZero() || c.limit > 0 || now.Sub(c.cutAt) < after {
		return unchecked
	}
	n, r := c.cutAnswers, c.cutRefused
	if !c.cutBound && !binds {
		c.cutAt = time.Time{}
		return byLoad
	}
	if n < 2*downFailures {
		return m.undecided(now)
	}
	n0, r0 := c.cutBefore[0], c.cutBefore[1]
	p := (r0 + r) / (n0 + n)
	se := math.Sqrt(p * (1 - p) * (1/n0 + 1/n))
	switch d := r0/n0 - r/n; {
	case d > 2*se:
		c.cutAt, c.lowered = time.Time{}, [2]float64{n, r}
		return byLoad
	case -d > se:
		// A cut does not raise a share refused at random: the share
		// before it was that of the first refusals of a pace grown past
		// the host's capacity, which the cut left past it.
		c.cutAt = time.Time{}
		return byLoad
	case r < downFailures && d < 0:
		// Too few refusals to tell, at a share above the one before:
		// taken for load, as a pace past the capacity of a host that
		// takes a few a second refuses.
		c.cutAt = time.Time{}
		return byLoad
	case r < downFailures:
		return m.undecided(now)
	}
	c.cutAt = time.Time{}
	m.exShare = r / n
	l.log(host, "retryhttp: refusals by chance", slog.Float64("share", round2(m.exShare)))
	if c.cutFrom == 0 {
		m.ctl = control{}
		m.setState(HostFailing, now)
		return byChance
	}
	c.holdUntil, c.grownAt = now, now
	return byChance
}

// undecided: the check of the cut waits for more answers, forgetAfter at
// most.
func (m *hostModel) undecided(now time.Time) cutVerdict {
	if now.Sub(m.ctl.cutAt) >= forgetAfter {
		m.ctl.cutAt = time.Time{}
		return byLoad
	}
	return undecided
}

// grow raises a pace or limit that binds: up to just below what the host
// accepted when it last refused, a while there, then faster and faster
// past it, in case the host can take more now.
func (m *hostModel) grow(l *localLimiter, host string, now time.Time) {
	c := &m.ctl
	if c.limit > 0 {
		switch {
		case float64(c.limit) < c.ceil-1:
			return // it grows with its accepted answers (acked)
		case !c.nearAt.IsZero() && now.Sub(c.nearAt) < 2*holdTime:
			return
		case c.nearAt.IsZero():
			c.nearAt = now
			return
		default:
			c.limit += int(c.step)
			c.step = min(2*c.step, float64(max(c.limit/2, 1)))
		}
		return
	}
	c.cutAt = time.Time{} // a pace grown since the cut tells nothing of it
	if m.state == HostRecovering && c.ceil == 0 {
		m.setRate(l, host, 2*c.rate, now) // nothing refused since it came back
		return
	}
	near := nearShare * c.ceil
	next := c.rate * 2
	switch {
	case m.q.spare && c.ceil == 0:
		// The host says it has more than the pace takes: a quarter more
		// each hold until a refusal says where it ends. (Doubling
		// overshoots by as much, and the refusals of a hundred workers
		// there cost pages.)
		next = c.rate * spareGrowth
	case c.rate < near:
		next = min(next, near)
		if next >= near {
			c.nearAt = now
		}
	case !c.nearAt.IsZero() && now.Sub(c.nearAt) < 2*holdTime:
		return
	default:
		next = c.rate * (1 + c.step)
		c.step = min(3*c.step, 1)
	}
	if m.q.active() && !m.q.beyond {
		if r := m.q.paceRate(); r > 0 {
			next = min(next, r)
		}
	}
	m.setRate(l, host, next, now)
}

// pace is the learned pace, unlimited when none.
func (m *hostModel) pace() Pace {
	if m.ctl.rate > 0 {
		return newPace(rate.Limit(m.ctl.rate), max(m.ctl.burst, 1))
	}
	if r := m.q.paceRate(); r > 0 {
		// The rate the host announces, a window's quota at once: what
		// remains of it is held apart (quotaWait).
		return newPace(rate.Limit(r), m.q.limit)
	}
	return Pace{Limit: rate.Inf}
}

// status says what the record knows, for Learn's caller.
func (m *hostModel) status() HostStatus {
	s := HostStatus{State: m.state, Since: m.since, Pace: m.pace(), InFlight: m.ctl.limit}
	if m.state == HostDown {
		s.Retry = m.down.next
	}
	return s
}

// expired reports whether the record can be forgotten: nothing is in
// flight, it is not down or holding a pace (unless nobody asked for the
// host lately), and nothing went wrong with the host for forgetAfter.
func (m *hostModel) expired(now time.Time) bool {
	if (m.inflight > 0 || m.timing) && now.Sub(m.seen) < forgetAfter {
		return false
	}
	if now.Sub(m.seen) >= forgetAfter {
		return true
	}
	if m.state == HostDown || m.ctl.rate > 0 || m.ctl.limit > 0 || (m.q.active() && m.q.tokens(now) < 1) {
		return false
	}
	return now.Sub(m.lastTrouble) >= forgetAfter && (!m.q.active() || now.Sub(m.q.at) >= forgetAfter)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// log writes one line about a host's change of state, when there is a
// logger.
func (l *localLimiter) log(host, msg string, attrs ...slog.Attr) {
	if l.logger == nil {
		return
	}
	l.logger.LogAttrs(context.Background(), slog.LevelInfo, msg, append([]slog.Attr{slog.String("host", host)}, attrs...)...)
}

// logPace says a learned pace changed: set, dropped, halved or doubled.
func (l *localLimiter) logPace(host string, from, to float64) {
	l.log(host, "retryhttp: learned pace", paceAttr("from", from), paceAttr("to", to))
}

// paceAttr is a learned pace in a log line: attempts a second, or
// "unlimited".
func paceAttr(key string, r float64) slog.Attr {
	if r <= 0 {
		return slog.String(key, "unlimited")
	}
	return slog.String(key, fmt.Sprintf("%g/s", round2(r)))
}

// sliding counts events over the last second in two one-second bins: the
// current one whole, and the share of the last that the second still
// covers.
type sliding struct {
	start     time.Time // the current bin's start
	cur, prev float64
}

func (s *sliding) roll(now time.Time) {
	switch d := now.Sub(s.start); {
	case d < time.Second:
	case d < 2*time.Second:
		s.start, s.prev, s.cur = s.start.Add(time.Second), s.cur, 0
	default:
		s.start, s.prev, s.cur = now, 0, 0
	}
}

func (s *sliding) add(now time.Time, n float64) {
	s.roll(now)
	s.cur += n
}

func (s *sliding) lastSecond(now time.Time) float64 {
	s.roll(now)
	return s.cur + s.prev*(1-float64(now.Sub(s.start))/float64(time.Second))
}

// twoSeconds keeps the largest value seen this second and the last.
type twoSeconds struct {
	start     time.Time
	cur, prev int
}

func (w *twoSeconds) roll(now time.Time) {
	switch d := now.Sub(w.start); {
	case d < time.Second:
	case d < 2*time.Second:
		w.start, w.prev, w.cur = w.start.Add(time.Second), w.cur, 0
	default:
		w.start, w.prev, w.cur = now, 0, 0
	}
}

func (w *twoSeconds) add(now time.Time, v int) {
	w.roll(now)
	w.cur = max(w.cur, v)
}

func (w *twoSeconds) max(now time.Time) int {
	w.roll(now)
	return max(w.cur, w.prev)
}

// latencies keeps a host's recent answer latencies, for its 95th
// percentile: the last 64, in a ring; the percentile is worked out again
// every eighth answer.
type latencies struct {
	ring   [64]time.Duration
	n      int
	next   int
	fresh  int // answers since the percentile was worked out
	cached time.Duration
}

func (ls *latencies) add(d time.Duration) {
	ls.ring[ls.next] = d
	ls.next = (ls.next + 1) % len(ls.ring)
	ls.n = min(ls.n+1, len(ls.ring))
	ls.fresh++
}

// p95 is the 95th percentile of the latencies kept; 0 when none.
func (ls *latencies) p95() time.Duration {
	if ls.n == 0 {
		return 0
	}
	if ls.cached > 0 && ls.fresh < 8 {
		return ls.cached
	}
	ls.fresh, ls.cached = 0, ls.percentile95()
	return ls.cached
}

func (ls *latencies) percentile95() time.Duration {
	var sorted [64]time.Duration
	s := sorted[:ls.n]
	copy(s, ls.ring[:ls.n])
	// Insertion sort: 64 values at most, and no allocation.
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[(len(s)*95+99)/100-1]
}

// observe reads what an answer says of its host, parks the host when it
// named a wait, tells the limiter what the answer says of the host, and
// fills in a for decide. It reports false for a plain success: nothing to
// observe and nothing to decide. For a host without a model that costs
// three header lookups: no clock reading, no parsing and no call to the
// limiter.
func (c *call) observe(a *answer) bool {
	t, resp := c.t, a.resp
	var (
		h     http.Header
		code  int
		quota bool
	)
	if resp != nil {
		h, code = resp.Header, resp.StatusCode
		// A host that announces a quota says what remains of it too: a
		// few map lookups (quotaHeaders) tell such an answer.
		quota = quotaHeaders(h)
	}
	plain := resp != nil && code < 400 && c.retryIf == nil && !t.statuses.has(code)
	tell := a.adm.report || quota || t.hedgeLearns
	if plain && !tell {
		if tell = c.sentBeforeRecord(); !tell {
			return false
		}
	}
	now := t.clock.Now()
	a.now = now
	sig := Signal{Now: now, Ticket: a.adm.ticket, Latency: now.Sub(a.adm.at), Status: code, Reset: -1, Remaining: -1,
		KeepLatency: t.hedgeLearns}
	if resp == nil {
		sig.Err, sig.Failed = a.err, true
		sig.Canceled = c.ctx.Err() != nil // the caller's doing, not the host's
		sig.Unreachable = dialFailed(a.err)
	} else {
		c.readWaits(a, h, quota, &sig)
	}
	a.refused = sig.Refused
	if o := sig.outcome(); t.noLearning || (!tell && (o == accepted || o == saysNothing)) {
		if t.noLearning {
			c.latencyOnly(&sig, o, a.adm.report) // hedge.go: the learned hedge delay's latencies
		}
		return !plain
	}
	sig.Sent, sig.InFlight = t.sentLastSecond(now), int(t.inflight.Load())
	st, err := t.limiter.Learn(c.ctx, c.hostName(), sig)
	if err != nil && t.logger != nil {
		t.logger.LogAttrs(c.ctx, slog.LevelWarn, "retryhttp: learning failed",
			slog.String("host", c.hostName()), slog.String("error", err.Error()))
	}
	a.down = st.State == HostDown
	a.paced = sig.Refused && (st.State == HostOverloaded || st.State == HostRecovering)
	return !plain
}

// sentBeforeRecord reports, for an attempt that got no ticket, whether a
// host just got a record: its answer may be one of a burst that host is
// still answering, which the record wants to hear of (see held). One
// atomic load while no host has a record.
func (c *call) sentBeforeRecord() bool {
	l := c.t.free
	if l == nil || l.learning.Load() == 0 {
		return false
	}
	return c.t.clock.Now().Sub(l.epoch).Nanoseconds() < l.freshUntil.Load()
}

// readWaits reads the waits and the quota an answer names, parks the host
// when it named one, and fills in the Signal.
func (c *call) readWaits(a *answer, h http.Header, quota bool, sig *Signal) {
	t, resp, now := c.t, a.resp, a.now
	code := resp.StatusCode
	var q announcement
	// A quota of some of the host's endpoints (GitHub's search, graphql,
	// ... beside core, under the same header names) says nothing of the
	// host: it paces nothing, and its spent quota holds only the request
	// that met it (which waits for the reset), not the host's others. A
	// Retry-After on a refusal is the host's word all the same.
	scoped := quota && scopedQuota(h)
	if quota && !t.noLearning && !scoped {
		q = announced(h, now)
	}
	a.wait, a.named = serverWait(resp, now)
	park := a.named && a.wait > 0 && (code >= 400 || t.noLearning || q.limit == 0)
	if park && scoped {
		_, said := retryAfter(h, now)
		park = said && code >= 400
	}
	// A spent quota on a success is the model's to hold while it learns
	// (until the reset, or the next grant of a window that slides); a
	// refusal that names its moment parks the host.
	if park {
		until := t.park(c.ctx, c.hostName(), now, max(a.wait, t.raFloor))
		if len(t.onPark) > 0 {
			ev := ParkEvent{Request: c.req, Host: c.hostName(), Until: until, Status: code}
			for _, hook := range t.onPark {
				hook(ev)
			}
		}
	}
	limited := code == http.StatusTooManyRequests || (!scoped && quotaRefusal(resp, now)) // the host says it limits the rate
	// A 503 or 529 is a refusal too: bare (nginx's limit_req, a full
	// queue), or naming when to come back, which says the host limits
	// what it takes as a 429 does.
	busy := code == http.StatusServiceUnavailable || code == statusOverloaded
	sig.Refused = limited || busy
	if (limited || busy) && a.named {
		sig.Wait = max(a.wait, t.raFloor)
	}
	sig.Limit, sig.Window, sig.Reset, sig.Remaining = q.limit, q.window, q.reset, q.remaining
}

// dialFailed reports an attempt that never got a connection: a dial that
// failed, refused or unreachable.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// serverWait is the wait a response names: Retry-After on an error status,
// else the reset of a spent quota.
func serverWait(resp *http.Response, now time.Time) (time.Duration, bool) {
	h := resp.Header
	if resp.StatusCode >= 400 {
		if w, ok := retryAfter(h, now); ok {
			return w, true
		}
	}
	return quotaReset(h, now)
}

// learnMaxWindow is the longest window an announced quota may have: a
// longer one is absurd, and ignored.
const learnMaxWindow = 24 * time.Hour

// tookQuota counts an attempt against the host's announced quota.
func (m *hostModel) tookQuota() {
	if m.q.active() {
		m.q.taken++
		if m.q.rolled {
			m.q.since++
		}
	}
}

// syncQuota charges the pace's burst, once, with what a window just seen
// to slide still counts: a client that waited for a reset has its whole
// burst in hand, which the window would refuse. Only when the quota is
// what paces the host.
func (m *hostModel) syncQuota(st *hostState, pace Pace, now time.Time) {
	q := &m.q
	if q.renewed {
		// The slots handed out were of the announcement replaced: the
		// new one is charged below with what it says remains, no more.
		q.renewed = false
		if st.tat.After(now) {
			st.tat = now
		}
	}
	if q.syncAt.IsZero() {
		return
	}
	if m.ctl.rate == 0 && pace == m.pace() {
		floor := q.syncAt.Add(time.Duration(max(pace.Burst-q.syncLeft, 0)) * pace.interval())
		if !q.resetAt.IsZero() {
			// Whatever remains, the window is whole at its reset: no
			// charge holds a slot past it.
			if whole := q.resetAt.Add(time.Duration(pace.Burst-1) * pace.interval()); floor.After(whole) {
				floor = whole
			}
		}
		if st.tat.Before(floor) {
			st.tat = floor
		}
	}
	q.syncAt = time.Time{}
}
