// Command lab replays the scenarios of the project's seeds, the field notes
// in shared/seeds, through the real retryhttp.Transport against stub hosts,
// on a virtual clock, and prints one table: what a naive retry loop cost,
// what retryhttp cost, and the figure the seed reported.
//
//	go run ./examples/lab
//
// Minutes of simulated traffic take well under a second, and the figures
// are the same on every run: the clock is virtual (retryhttp.WithClock), the
// collectors take turns in a fixed order, and the jitter comes from a seeded
// source (retryhttp.WithRand).
//
// The files: clock.go is the virtual clock and its scheduler, hosts.go the
// stub hosts and the in-memory network that serves them, scenarios.go the
// naive loops and the retryhttp runs, table.go the table.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

// run replays every scenario and writes the table to w.
func run(w io.Writer) error {
	if _, err := fmt.Fprint(w, "The seeds' scenarios, replayed through retryhttp.Transport on a virtual clock.\n"+
		"Stub hosts answer in memory; a request takes 50 ms (seed 002's shop) or 1 ms (seed 000's loopback stub).\n\n"); err != nil {
		return err
	}
	return WriteTable(w, Rows())
}
