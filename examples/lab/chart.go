package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// The charts: for every row, the requests that reached the host in each
// second, the naive run above the retryhttp run, in Unicode blocks.

// chartWidth is the most characters a chart line takes: a minute, a second
// a character. A longer run takes more seconds a character.
const chartWidth = 60

// bucketSizes are the spans one character may stand for, shortest first:
// ten of each make a round tick.
var bucketSizes = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// levels are the eighths of a character cell, from one eighth to full.
var levels = []rune("▁▂▃▄▅▆▇█")

// lastArrival is the latest arrival in any of the series, 0 if none.
func lastArrival(series ...[]time.Duration) time.Duration {
	var last time.Duration
	for _, s := range series {
		if len(s) > 0 {
			last = max(last, slices.Max(s))
		}
	}
	return last
}

// bucketFor returns the shortest span of bucketSizes that puts every
// arrival up to last in at most width buckets, and how many buckets that
// takes.
func bucketFor(last time.Duration, width int) (time.Duration, int) {
	for _, b := range bucketSizes {
		if n := int(last/b) + 1; n <= width {
			return b, n
		}
	}
	b := bucketSizes[len(bucketSizes)-1]
	return b, int(last/b) + 1
}

// histogram counts the arrivals in each of n buckets of span b.
func histogram(at []time.Duration, b time.Duration, n int) []int {
	counts := make([]int, n)
	for _, a := range at {
		if i := int(a / b); i >= 0 && i < n {
			counts[i]++
		}
	}
	return counts
}

// sparkline draws counts as blocks, top the count of a full block; an empty
// bucket is a space, any other at least one eighth.
func sparkline(counts []int, top int) string {
	var b strings.Builder
	for _, c := range counts {
		if c <= 0 || top <= 0 {
			b.WriteByte(' ')
			continue
		}
		level := (c*len(levels) + top - 1) / top // rounded up: 1 to 8
		b.WriteRune(levels[min(level, len(levels))-1])
	}
	return b.String()
}

// span names a bucket span: "1 s", "30 s", "5 min", "2 h".
func span(b time.Duration) string {
	switch {
	case b < time.Minute:
		return fmt.Sprintf("%d s", int(b/time.Second))
	case b < time.Hour:
		return fmt.Sprintf("%d min", int(b/time.Minute))
	default:
		return fmt.Sprintf("%d h", int(b/time.Hour))
	}
}

// axis returns a time axis under n buckets of span b: a tick label every
// ten characters, in seconds while a bucket is under a minute (the unit
// after the last), else in minutes ("20m") or hours ("5h").
func axis(b time.Duration, n int) string {
	line := []rune(strings.Repeat(" ", n))
	end := 0 // first free column
	for i := 0; i < n; i += 10 {
		t := time.Duration(i) * b
		var label string
		switch {
		case b < time.Minute:
			label = fmt.Sprint(int(t / time.Second))
		case t == 0:
			label = "0"
		case t%time.Hour == 0:
			label = fmt.Sprintf("%dh", int(t/time.Hour))
		default:
			label = fmt.Sprintf("%dm", int(t/time.Minute))
		}
		if i < end || i+len(label) > n+2 {
			continue
		}
		for len(line) < i+len(label) {
			line = append(line, ' ')
		}
		copy(line[i:], []rune(label))
		end = i + len(label) + 1
	}
	out := strings.TrimRight(string(line), " ")
	if b < time.Minute {
		out += " s"
	}
	return out
}

// WriteCharts writes, for every row, the requests a second that reached the
// host over time: the naive run above the retryhttp run, on one time axis
// and one scale, a full block the row's busiest character.
func WriteCharts(w io.Writer, rows []Row) error {
	var b strings.Builder
	b.WriteString("\nRequests reaching the host over time, naive loop above retryhttp, one character a second\n" +
		"unless the row says otherwise; a row's two lines share one scale, █ = the count given:\n")
	labels := []string{"naive", "retryhttp"}
	pad := 0
	for _, l := range labels {
		pad = max(pad, utf8.RuneCountInString(l))
	}
	for i, r := range rows {
		bucket, n := bucketFor(lastArrival(r.NaiveAt, r.RetryAt), chartWidth)
		naive := histogram(r.NaiveAt, bucket, n)
		retry := histogram(r.RetryAt, bucket, n)
		top := max(slices.Max(naive), slices.Max(retry))
		unit := "request"
		if top != 1 {
			unit += "s"
		}
		if bucket > time.Second {
			unit += " in " + span(bucket) + "; 1 char = " + span(bucket)
		} else {
			unit += " in a second"
		}
		fmt.Fprintf(&b, "\n%2d. %s  [█ = %d %s]\n", i+1, r.Scenario, top, unit)
		indent := "    " + strings.Repeat(" ", pad+1)
		for j, counts := range [][]int{naive, retry} {
			at := r.NaiveAt
			if j == 1 {
				at = r.RetryAt
			}
			fmt.Fprintf(&b, "    %-*s │%s│ %d sent\n", pad, labels[j], sparkline(counts, top), len(at))
		}
		fmt.Fprintf(&b, "%s %s\n", indent, axis(bucket, n))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
