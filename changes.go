package retryhttp

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// The model logs nothing: each change worth a line (a new state, a pace
// moved by half or double, a quota announced) is noted in the changes its
// caller passes in, and the caller logs them. So the model stays a pure
// function of its record, the answer and the time, and a Limiter that
// keeps records elsewhere can say the same things its own way.

// changeKind names a change of a host the model reports.
type changeKind uint8

const (
	evQuota    changeKind = iota + 1 // a quota announced: n per window
	evDown                           // the host is down: since, last
	evBack                           // back from down, paced at to (0: not paced)
	evPace                           // the learned pace moved: from, to
	evTryLimit                       // a limit in flight tried: n
	evChance                         // refusals taken for chance: share
)

// change is one change the model reports.
type change struct {
	kind     changeKind
	from, to float64 // a pace before and after (evBack, evPace), or a share (evChance)
	n        int
	window   time.Duration
	since    time.Time
	last     string
}

// changes holds what one call into the model reported: four at most, more
// than one answer or one adjustment makes (a quota announced, a pace cut,
// a fall).
type changes struct {
	n int
	e [4]change
}

func (ev *changes) add(e change) {
	if ev != nil && ev.n < len(ev.e) {
		ev.e[ev.n] = e
		ev.n++
	}
}

// pace notes a learned pace that changed by half or more, or went or came.
func (ev *changes) pace(from, to float64) {
	if from == to || (from > 0 && to > 0 && to < 2*from && to > from/2) {
		return
	}
	ev.add(change{kind: evPace, from: from, to: to})
}

// logChanges writes one line for each change, when there is a logger.
func (l *localLimiter) logChanges(host string, ev *changes) {
	if l.logger == nil {
		return
	}
	for _, e := range ev.e[:ev.n] {
		switch e.kind {
		case evQuota:
			l.log(host, "retryhttp: quota", slog.Int("limit", e.n), slog.String("window", e.window.String()))
		case evDown:
			l.log(host, "retryhttp: host down", slog.String("since", e.since.UTC().Format(time.RFC3339Nano)),
				slog.String("last", e.last))
		case evBack:
			l.log(host, "retryhttp: host back", paceAttr("pace", e.to))
		case evPace:
			l.log(host, "retryhttp: learned pace", paceAttr("from", e.from), paceAttr("to", e.to))
		case evTryLimit:
			l.log(host, "retryhttp: trying limit", slog.Int("in_flight", e.n))
		case evChance:
			l.log(host, "retryhttp: refusals by chance", slog.Float64("share", round2(e.from)))
		}
	}
}

func (l *localLimiter) log(host, msg string, attrs ...slog.Attr) {
	l.logger.LogAttrs(context.Background(), slog.LevelInfo, msg, append([]slog.Attr{slog.String("host", host)}, attrs...)...)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// paceAttr is a learned pace in a log line: attempts a second, or
// "unlimited".
func paceAttr(key string, r float64) slog.Attr {
	if r <= 0 {
		return slog.String(key, "unlimited")
	}
	return slog.String(key, fmt.Sprintf("%g/s", round2(r)))
}
