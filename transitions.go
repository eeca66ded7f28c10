package retryhttp

// The host model's transitions, in one table as sony/gobreaker holds its
// own: every change of a record's state goes through move, which makes
// it only from the states the table names. The reason for each is where
// it is made (the function of the same name).
//
// A record starts Healthy, at its first failure, refusal or quota, and
// is forgotten (back to no record at all, which is Healthy) when nothing
// was heard of its host for forgetAfter, or nothing went wrong with it
// (expired).

// transition names a change of a host's state.
type transition uint8

const (
	toFail     transition = iota // fail: a failure that load does not explain
	toOverload                   // overload: a refusal that load explains
	toChance                     // checkCut: a cut that bound did not move the share refused
	toFall                       // fall: only failures, in a run its share makes unlikely
	toRecover                    // recover: an answer got through, and what it took is known
	toReturn                     // recover: an answer got through, and nothing is known of what it takes
	toSettle                     // adjust: the pace holds nothing back, and nothing went wrong for long
	toHeal                       // heal: nothing went wrong for forgetAfter, the record kept
)

// stateSet is a set of states, one bit each.
type stateSet uint8

func states(s ...HostState) stateSet {
	var set stateSet
	for _, x := range s {
		set |= 1 << x
	}
	return set
}

func (set stateSet) has(s HostState) bool { return set&(1<<s) != 0 }

// transitions is the table: each transition's name, the states it is made
// from, and the state it leads to.
var transitions = [...]struct {
	name string
	from stateSet
	to   HostState
}{
	toFail:     {"fail", states(HostHealthy), HostFailing},
	toOverload: {"overload", states(HostHealthy, HostFailing), HostOverloaded},
	toChance:   {"chance", states(HostOverloaded), HostFailing},
	toFall:     {"fall", states(HostHealthy, HostFailing, HostOverloaded, HostRecovering), HostDown},
	toRecover:  {"recover", states(HostDown), HostRecovering},
	toReturn:   {"return", states(HostDown), HostFailing},
	toSettle:   {"settle", states(HostHealthy, HostFailing, HostOverloaded, HostRecovering), HostHealthy},
	toHeal:     {"heal", states(HostFailing), HostHealthy},
}

// move makes transition t at now, when the record is in a state t is made
// from, and reports whether it was.
func (m *hostModel) move(t transition, now instant) bool {
	tr := &transitions[t]
	if !tr.from.has(m.state) {
		return false
	}
	if m.state != tr.to {
		m.state, m.since = tr.to, now
	}
	return true
}
