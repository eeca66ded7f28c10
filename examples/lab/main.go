// Command lab replays the scenarios of the project's seeds, the field notes
// in shared/seeds, through the real retryhttp.Transport against stub hosts,
// on a virtual clock, and prints one table: what a naive retry loop cost,
// what retryhttp cost, and the figure the seed reported. Five rows have no
// seed: a host that announces its quota in rate-limit headers, a host
// whose capacity rises mid-run, and one for each state of the host model
// beyond healthy that the seeds do not show: a failing host (a broken
// replica), a down host that comes back (an outage and its return, under
// open-loop traffic) and a host overloaded by what it has in flight (10
// slots, no queue). Under the table, a chart of each row shows the
// requests that reached the host each second, naive above retryhttp.
//
//	go run ./examples/lab
//
// Minutes of simulated traffic take well under a second, and the figures
// are the same on every run: the clock is virtual (retryhttp.WithClock), the
// collectors take turns in a fixed order, and the jitter comes from a seeded
// source (retryhttp.WithRand).
//
// With -svg, it also draws the charts of four rows (4, 9, 12 and 13) into
// SVG files in the directory named, for the README:
//
//	go run ./examples/lab -svg docs
//
// The files: clock.go is the virtual clock and its scheduler, hosts.go the
// stub hosts and the in-memory network that serves them, scenarios.go the
// naive loops and the retryhttp runs of the seeds' scenarios, states.go
// those of the host model's states, table.go the table, chart.go the
// terminal charts under it, svg.go the SVG charts.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	svgDir := flag.String("svg", "", "also write the SVG charts (lab-collectors.svg, lab-quota.svg, lab-outage.svg, lab-slots.svg) into this `directory`")
	flag.Parse()
	rows := Rows()
	if err := report(os.Stdout, rows); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
	if *svgDir != "" {
		files, err := WriteSVGs(*svgDir, rows)
		for _, f := range files {
			fmt.Fprintln(os.Stderr, "lab: wrote", f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "lab:", err)
			os.Exit(1)
		}
	}
}

// run replays every scenario and writes the table and the charts to w.
func run(w io.Writer) error { return report(w, Rows()) }

// report writes the table of rows, then their charts, to w.
func report(w io.Writer, rows []Row) error {
	if _, err := fmt.Fprint(w, "The field notes' failures, and the host model's states, replayed through retryhttp.Transport on a virtual clock.\n"+
		"Stub hosts answer in memory; a request takes 50 ms (the shop of field note 002), 1 ms (the loopback stub of note 000),\n"+
		"or what its row says.\n\n"); err != nil {
		return err
	}
	if err := WriteTable(w, rows); err != nil {
		return err
	}
	return WriteCharts(w, rows)
}
