package retryhttp

import (
	"errors"
	"fmt"
	"time"
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
