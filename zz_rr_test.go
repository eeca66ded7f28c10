package retryhttp

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"
)

type rrHost struct {
	mu   sync.Mutex
	i    int
	bad  int
	code int
	lat  time.Duration
}

func (h *rrHost) serve(ctx context.Context) simAnswer {
	h.mu.Lock()
	k := h.i % 3
	h.i++
	h.mu.Unlock()
	simSleep(ctx, h.lat)
	if k == h.bad {
		return simAnswer{status: h.code}
	}
	return simAnswer{status: 200}
}

func TestZZRoundRobinPace(t *testing.T) {
	for _, code := range []int{502, 500, 503} {
		for _, p := range []float64{1, 3, 10, 30, 200} {
			for _, burst := range []int{1, 3, 20} {
				for _, w := range []int{1, 3, 10, 30} {
					var res string
					synctest.Test(t, func(t *testing.T) {
						base := &simBase{host: &rrHost{bad: 2, code: code, lat: 5 * time.Millisecond}, start: time.Now()}
						tr := New(WithBase(base), WithPace(rate.Limit(p), burst))
						client := &http.Client{Transport: tr}
						start := time.Now()
						pages := 200
						out := make([]simPage, pages)
						var mu sync.Mutex
						next := 0
						var wg sync.WaitGroup
						for range w {
							wg.Go(func() {
								for {
									mu.Lock()
									i := next
									next++
									mu.Unlock()
									if i >= pages {
										return
									}
									out[i] = simFetch(client, i, start)
								}
							})
						}
						wg.Wait()
						down, got := 0, 0
						for _, pg := range out {
							if pg.err == "down" {
								down++
							}
							if pg.got {
								got++
							}
						}
						if down > 0 || got < pages*9/10 {
							res = fmt.Sprintf("code %d pace %v burst %d w %d: got %d down %d", code, p, burst, w, got, down)
						}
					})
					if res != "" {
						t.Log(res)
					}
				}
			}
		}
	}
	_ = strings.Contains
}
