package bench

import (
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The benchmarks are named Case/base=B/lib=L so that benchstat can put the
// libraries side by side: benchstat -col /lib. Each leaf runs one library
// over a fresh base (its own pooled *http.Transport and httptest.Server for
// base=loop), and fails as soon as one operation does not end in a 200 with
// its body, or when the base did not see exactly the expected requests and
// body bytes. Setup and teardown are outside the timer.
//
// Besides ns/op (wall time), each reports cpu-ns/op: the CPU time the whole
// process spent (user and system, every goroutine, the GC and, on loopback,
// the server) divided by the operations. The machines are shared: time
// spent waiting for a core that another process holds counts in ns/op but
// not in cpu-ns/op, which is the steadier of the two on a busy machine. In
// the parallel benchmarks cpu-ns/op adds up both cores, so it is about
// twice ns/op.

func BenchmarkGET(b *testing.B)         { benchCases(b, caseGET, false) }
func BenchmarkGETParallel(b *testing.B) { benchCases(b, caseGET, true) }
func BenchmarkPOST1KiB(b *testing.B)    { benchCases(b, casePOST, false) }
func BenchmarkRetry503(b *testing.B)    { benchCases(b, caseRetry, false) }
func BenchmarkUpload1MiB(b *testing.B)  { benchCases(b, caseUpload, false) }

func benchCases(b *testing.B, c benchCase, parallel bool) {
	for _, kind := range c.bases {
		b.Run("base="+kind, func(b *testing.B) {
			for _, l := range libs {
				b.Run("lib="+l.name, func(b *testing.B) {
					if parallel {
						benchParallel(b, kind, c, l)
					} else {
						benchSequential(b, kind, c, l)
					}
				})
			}
		})
	}
}

func benchSequential(b *testing.B, kind string, c benchCase, l lib) {
	f := newFixture(kind, c, false)
	defer f.close()
	d := l.make(f.base)
	tmpl := f.template(c)
	b.ReportAllocs()
	ops := int64(0)
	cpu := cpuTime()
	for b.Loop() {
		if err := do(d, tmpl, c); err != nil {
			b.Fatal(err)
		}
		ops++
	}
	b.StopTimer()
	reportCPU(b, cpu, ops)
	if err := f.verify(c, ops); err != nil {
		b.Fatal(err)
	}
}

func benchParallel(b *testing.B, kind string, c benchCase, l lib) {
	f := newFixture(kind, c, false)
	defer f.close()
	d := l.make(f.base)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		tmpl := f.template(c) // a request per goroutine, sent again and again
		for pb.Next() {
			if err := do(d, tmpl, c); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportCPU(b, cpu, int64(b.N))
}

// cpuTime is the CPU time the process has used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, since time.Duration, ops int64) {
	if ops > 0 && since > 0 {
		b.ReportMetric(float64(cpuTime()-since)/float64(ops), "cpu-ns/op")
	}
}

// BenchmarkAddedGET measures what each library adds to a GET over the bare
// client on the same in-memory base, paired so that the load of a shared
// machine cancels out: each round times a block of GETs through the bare
// client and a block through the library back to back (in alternating
// order), and the metric added-ns/op is the median over the rounds of the
// difference per GET. A burst of load lasts longer than a round and so
// lands on both blocks alike, where two separate benchmarks would see it
// on one only. ns/op (the time of a round) is suppressed as meaningless;
// run it without -benchmem, since a round is not one operation (the GET
// benchmarks give the exact B/op and allocs/op).
func BenchmarkAddedGET(b *testing.B) {
	for _, kind := range []string{"mem", "memtr"} {
		b.Run("base="+kind, func(b *testing.B) {
			for _, l := range libs[1:] {
				b.Run("lib="+l.name, func(b *testing.B) { benchAdded(b, kind, l) })
			}
		})
	}
}

func benchAdded(b *testing.B, kind string, l lib) {
	const block = 200
	fb, fl := newFixture(kind, caseGET, false), newFixture(kind, caseGET, false)
	defer fb.close()
	defer fl.close()
	bare, d := newBare(fb.base), l.make(fl.base)
	tb, tl := fb.template(caseGET), fl.template(caseGET)
	run := func(d doer, tmpl *http.Request) time.Duration {
		start := time.Now()
		for range block {
			if err := do(d, tmpl, caseGET); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	var diffs []float64
	for b.Loop() {
		var tbare, tlib time.Duration
		if len(diffs)%2 == 0 {
			tbare, tlib = run(bare, tb), run(d, tl)
		} else {
			tlib, tbare = run(d, tl), run(bare, tb)
		}
		diffs = append(diffs, float64(tlib-tbare)/block)
	}
	b.StopTimer()
	slices.Sort(diffs)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(diffs[len(diffs)/2], "added-ns/op")
}
