package retryhttp

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

// TestRecordSize: what a host that failed, refused or was down keeps is at
// most 480 bytes, its entry and its model together as the allocator rounds
// them (the model 448, a size class of its own; the entry 32); an
// announced quota adds 112, its size class. The issue that asked for it measured
// 2,450 bytes a record.
func TestRecordSize(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"hostModel", unsafe.Sizeof(hostModel{}), 448},
		{"hostState", unsafe.Sizeof(hostState{}), 32},
		{"quota", unsafe.Sizeof(quota{}), 112},
		{"outage (while down)", unsafe.Sizeof(outage{}), 56},
	}
	for _, s := range sizes {
		if s.got > s.want {
			t.Errorf("%s: %d bytes, want at most %d", s.name, s.got, s.want)
		}
	}
}

// TestRecordHeap: the heap a failing host's record holds, measured, not
// summed: 20,000 hosts each answer one 500, and the heap grows by what
// their records, entries, map slots and names take.
func TestRecordHeap(t *testing.T) {
	const hosts = 20000
	now := time.Unix(1e9, 0)
	l := newLocalLimiter(fixedClock{now})
	names := make([]string, hosts)
	for i := range names {
		names[i] = "host-" + strconv.Itoa(100000+i) + ".example:443" // 22 bytes, as a crawler's are
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for _, h := range names {
		if _, err := l.Learn(context.Background(), h, Signal{Now: now, Status: 500, Reset: -1, Remaining: -1}); err != nil {
			t.Fatal(err)
		}
	}
	per := (float64(heap()) - float64(before)) / hosts
	kept := 0
	for i := range l.shards {
		kept += len(l.shards[i].hosts)
	}
	runtime.KeepAlive(names)
	t.Logf("%d records, %.0f bytes a host (record, entry, map slot)", kept, per)
	if kept != hosts {
		t.Fatalf("%d records, want %d", kept, hosts)
	}
	// The record and entry (512), a map slot and its share of the map's
	// growth (about 60-100): the bound says what a crawler's million hosts
	// cost, under 600 MiB at the most.
	if per > 620 {
		t.Errorf("%.0f bytes a failing host, want at most 620", per)
	}
}

// fixedClock is a clock that stands still.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func (c fixedClock) Sleep(ctx context.Context, d time.Duration) error { return ctx.Err() }

// TestInstantSaturates: a record's moments saturate as time.Time's do, so
// that a remote value (a reset two centuries away, as a fuzzed header said
// it, which hung a request before) is a moment after every other, not one
// that wraps to before them all.
func TestInstantSaturates(t *testing.T) {
	epoch := time.Unix(1e9, 0)
	m := newModel(1, &epoch, epoch)
	now := m.at(epoch)
	far := now.Add(229 * 365 * 24 * time.Hour).Add(229 * 365 * 24 * time.Hour)
	if !far.After(now) || far.Sub(now) <= 0 {
		t.Errorf("now + 458 years = %d, not after now (%d): it wrapped", far, now)
	}
	if back := now.Add(-290 * 365 * 24 * time.Hour); !back.Before(now) || now.Sub(back) <= 0 {
		t.Errorf("now - 290 years = %d, not before now (%d)", back, now)
	}
	if got := m.at(epoch.Add(250 * 365 * 24 * time.Hour)); !got.After(now) {
		t.Errorf("250 years ahead as an instant: %d, not after now (%d)", got, now)
	}
	if got := m.time(m.at(epoch.Add(time.Hour))); !got.Equal(epoch.Add(time.Hour)) {
		t.Errorf("an hour ahead, there and back: %v, want %v", got, epoch.Add(time.Hour))
	}
	if m.at(time.Time{}) != 0 || !m.time(0).IsZero() {
		t.Error("the zero time and the zero instant are not each other's")
	}
}
