package redislimit

import (
	"fmt"
	"sync"
	"testing"
)

// The hosts whose freedom is remembered are bounded, whatever the number
// of hosts a process meets (a crawler): past freeMax the set starts anew.
func TestFreeHostsBounded(t *testing.T) {
	var f freeHosts
	for i := range 3 * freeMax {
		f.get(fmt.Sprintf("host%d.test", i)).free.Store(true)
	}
	n := 0
	f.m.Load().Range(func(any, any) bool { n++; return true })
	if n > freeMax {
		t.Errorf("%d hosts remembered after %d; want at most %d", n, 3*freeMax, freeMax)
	}
	if e, ok := f.load(fmt.Sprintf("host%d.test", 3*freeMax-1)); !ok || !e.free.Load() {
		t.Errorf("the last host met is not remembered")
	}
	var wg sync.WaitGroup // gets from many goroutines at once, under -race
	for g := range 8 {
		wg.Go(func() {
			for i := range freeMax / 2 {
				f.get(fmt.Sprintf("g%d-%d.test", g, i))
			}
		})
	}
	wg.Wait()
}
