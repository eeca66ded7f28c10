package retryhttp

import (
	"context"
	"fmt"
	"log/slog"
	"math"
)

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
