package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The SVG charts: for the rows that name a file, the requests a second that
// reached the host over time, the naive run's bars beside retryhttp's, in
// hand-written SVG.

// svgWidth is the most bars of each series an SVG chart draws: two minutes
// at a second a bar.
const svgWidth = 120

// Colours and geometry of an SVG chart. The plot starts below the title
// and the legend, which take as many lines as they need.
const (
	naiveColour = "#e8743b" // orange
	retryColour = "#2f6db3" // blue
	inkColour   = "#222222"
	greyColour  = "#666666"
	gridColour  = "#e3e3e3"
	shadeColour = "#f3e9e4" // a pale orange: the span in which the host refused everything
	fontFamily  = "DejaVu Sans, Helvetica, Arial, sans-serif"

	svgW          = 760
	plotLeft      = 64
	plotRight     = svgW - 28
	plotHeight    = 220
	titleSize     = 16
	titleChars    = 66 // a title line longer than this is wrapped at a comma
	legendMarker  = 11
	legendSpacing = 19
	legendChars   = 92 // a legend line longer than this is wrapped at a comma or semicolon
)

// WriteSVGs writes the SVG chart of every row that names a file into dir,
// creating dir if need be, and returns the paths written.
func WriteSVGs(dir string, rows []Row) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for i, r := range rows {
		if r.SVG == "" {
			continue
		}
		path := filepath.Join(dir, r.SVG)
		if err := os.WriteFile(path, SVG(i+1, r), 0o644); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

// SVG draws row n's chart: requests a second at the host, the naive run's
// bar beside retryhttp's in every second, the host's capacity as a dashed
// line, and the row's span shaded.
func SVG(n int, r Row) []byte {
	bucket, bins := bucketFor(lastArrival(r.NaiveAt, r.RetryAt), svgWidth)
	perSec := func(at []time.Duration) []float64 {
		counts := histogram(at, bucket, bins)
		rates := make([]float64, bins)
		for i, c := range counts {
			rates[i] = float64(c) / bucket.Seconds()
		}
		return rates
	}
	naive, retry := perSec(r.NaiveAt), perSec(r.RetryAt)
	top := max(slices.Max(naive), slices.Max(retry), r.Capacity) * 1.05 // headroom
	yStep := niceStep(top, 6)
	yMax := math.Ceil(top/yStep) * yStep
	total := float64(bins) * bucket.Seconds() // seconds across the plot
	xStep := niceStep(total, 12)

	// The header: title, subtitle, legend; then the plot.
	title := fmt.Sprintf("Row %d: %s", n, r.Scenario)
	titleLines := wrap(title, titleChars)
	legend := legendOf(r)
	lines := 0
	for _, l := range legend {
		lines += len(l.lines())
	}
	cursor := 30.0
	subtitleY := cursor + float64(len(titleLines)-1)*20 + 20
	legendY := subtitleY + 22
	plotTop := legendY + float64(lines-1)*legendSpacing + 40
	plotBottom := plotTop + plotHeight
	svgH := int(plotBottom) + 46

	x := func(s float64) float64 { return plotLeft + s/total*(plotRight-plotLeft) }
	y := func(v float64) float64 { return plotBottom - v/yMax*(plotBottom-plotTop) }

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">`+"\n",
		svgW, svgH, svgW, svgH, fontFamily)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(title))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", svgW, svgH)
	for i, line := range titleLines {
		text(&b, 24, cursor+float64(i)*20, titleSize, inkColour, "start", `font-weight="bold"`, line)
	}
	text(&b, 24, subtitleY, 12, greyColour, "start", "",
		"Requests reaching the host each second; go run ./examples/lab, on its virtual clock.")

	// The legend, with each run's figures from the table, the host's
	// capacity and the span shaded.
	ly := legendY
	for _, l := range legend {
		ly = l.draw(&b, ly)
	}

	// The span shaded, under the grid and the bars.
	if r.Shade[1] > 0 {
		x0, x1 := x(r.Shade[0].Seconds()), x(min(r.Shade[1].Seconds(), total))
		fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n",
			num(x0), num(plotTop), num(x1-x0), num(plotBottom-plotTop), shadeColour)
	}

	// Grid and y ticks.
	b.WriteString(`<g font-size="11" fill="` + greyColour + `" text-anchor="end">` + "\n")
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		if v > 0 {
			fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="%s" stroke-width="1"/>`+"\n",
				plotLeft, num(y(v)), plotRight, num(y(v)), gridColour)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%s">%s</text>`+"\n", plotLeft-7, num(y(v)+4), num(v))
	}
	b.WriteString("</g>\n")

	// The bars: in every bucket, naive on the left, retryhttp on the right.
	width := (plotRight - plotLeft) / float64(bins)
	bar := width * 0.4
	for i := range bins {
		x0 := plotLeft + float64(i)*width
		for j, s := range []struct {
			rate   float64
			colour string
		}{{naive[i], naiveColour}, {retry[i], retryColour}} {
			if s.rate <= 0 {
				continue
			}
			bx := x0 + width*0.1 + float64(j)*bar
			fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n",
				num(bx), num(y(s.rate)), num(bar), num(plotBottom-y(s.rate)), s.colour)
		}
	}

	// The host's capacity.
	if r.Capacity > 0 {
		cy := y(r.Capacity)
		fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="%s" stroke-width="1.5" stroke-dasharray="4 3"/>`+"\n",
			plotLeft, num(cy), plotRight, num(cy), inkColour)
	}

	// Axes, x ticks and the units.
	fmt.Fprintf(&b, `<path d="M%d %s V%s H%d" fill="none" stroke="%s" stroke-width="1"/>`+"\n",
		plotLeft, num(plotTop-8), num(plotBottom), plotRight, inkColour)
	b.WriteString(`<g font-size="11" fill="` + greyColour + `" text-anchor="middle">` + "\n")
	for s := 0.0; s <= total+xStep/100; s += xStep {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1"/>`+"\n",
			num(x(s)), num(plotBottom), num(x(s)), num(plotBottom+4), inkColour)
		fmt.Fprintf(&b, `<text x="%s" y="%s">%s</text>`+"\n", num(x(s)), num(plotBottom+17), num(s))
	}
	b.WriteString("</g>\n")
	text(&b, (plotLeft+plotRight)/2, plotBottom+36, 12, inkColour, "middle", "", "s (since the start of the run)")
	text(&b, plotLeft-7, plotTop-14, 12, inkColour, "start", "", "requests/s")
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// legendEntry is one entry of an SVG chart's legend: a run (a bar of its
// colour, its name in bold, its figures), the host's capacity (a dashed
// line) or a span shaded (a square of the shade).
type legendEntry struct {
	marker        string // "bar", "line" or "shade"
	colour        string
	name, figures string
}

// legendOf is the legend of row r's chart.
func legendOf(r Row) []legendEntry {
	legend := []legendEntry{
		{"bar", naiveColour, "naive loop", r.Naive},
		{"bar", retryColour, "retryhttp", r.Retry},
	}
	if r.Capacity > 0 {
		legend = append(legend, legendEntry{marker: "line", colour: inkColour, name: r.CapacityLabel})
	}
	if r.Shade[1] > 0 {
		legend = append(legend, legendEntry{marker: "shade", colour: shadeColour, name: r.ShadeLabel})
	}
	return legend
}

// lines is the entry's text, wrapped: a run's name is followed by its
// figures.
func (l legendEntry) lines() []string {
	if l.figures == "" {
		return wrap(l.name, legendChars)
	}
	return wrap(l.name+": "+l.figures, legendChars)
}

// draw writes the entry with its first line at y, and returns where the
// next entry's goes.
func (l legendEntry) draw(b *bytes.Buffer, y float64) float64 {
	switch l.marker {
	case "line":
		fmt.Fprintf(b, `<line x1="22" y1="%s" x2="36" y2="%s" stroke="%s" stroke-width="1.5" stroke-dasharray="4 3"/>`+"\n",
			num(y-4.5), num(y-4.5), l.colour)
	case "shade":
		fmt.Fprintf(b, `<rect x="24" y="%s" width="%d" height="%d" fill="%s" stroke="%s" stroke-width="0.5"/>`+"\n",
			num(y-legendMarker+1), legendMarker, legendMarker, l.colour, greyColour)
	default:
		fmt.Fprintf(b, `<rect x="24" y="%s" width="%d" height="%d" rx="2" fill="%s"/>`+"\n",
			num(y-legendMarker+1), legendMarker, legendMarker, l.colour)
	}
	for i, line := range l.lines() {
		if i == 0 && l.figures != "" {
			rest := strings.TrimPrefix(line, l.name)
			fmt.Fprintf(b, `<text x="42" y="%s" font-size="13" fill="%s"><tspan font-weight="bold">%s</tspan>%s</text>`+"\n",
				num(y), inkColour, esc(l.name), esc(rest))
		} else {
			text(b, 42, y, 13, inkColour, "start", "", line)
		}
		y += legendSpacing
	}
	return y
}

// wrap breaks s after commas and semicolons into lines of at most width
// characters where it can.
func wrap(s string, width int) []string {
	var lines []string
	for utf8.RuneCountInString(s) > width {
		cut := -1
		for i := range s {
			if utf8.RuneCountInString(s[:i]) > width {
				break
			}
			if s[i] == ',' || s[i] == ';' {
				cut = i
			}
		}
		if cut < 0 {
			break
		}
		lines = append(lines, s[:cut+1])
		s = strings.TrimLeft(s[cut+1:], " ")
	}
	return append(lines, s)
}

// text writes one text element; attrs are extra attributes, already escaped.
func text(b *bytes.Buffer, x, y, size float64, colour, anchor, attrs, s string) {
	if attrs != "" {
		attrs = " " + attrs
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" font-size="%s" fill="%s" text-anchor="%s"%s>%s</text>`+"\n",
		num(x), num(y), num(size), colour, anchor, attrs, esc(s))
}

// niceStep is the smallest step of 1, 2 or 5 times a power of ten that
// divides 0 to top in at most ticks steps.
func niceStep(top float64, ticks int) float64 {
	if top <= 0 {
		return 1
	}
	for p := math.Pow(10, math.Floor(math.Log10(top/float64(ticks)))); ; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if step := m * p; math.Ceil(top/step-1e-9) <= float64(ticks) {
				return step
			}
		}
	}
}

// num formats a coordinate or a tick: at most two decimals, no trailing
// zeros.
func num(f float64) string {
	return strconv.FormatFloat(math.Round(f*100)/100, 'f', -1, 64)
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
