package bench

import (
	"fmt"
	"time"
)

// A proxyCell is one proxy configuration, one load and one set of
// backends, with its ideal time and the fewest requests a page any client
// could send through it.
type proxyCell struct {
	name     string // the cell's key
	proxy    string // "nginx" or "haproxy"
	conf     string // directives, see nginxConf and haproxyConf
	backends []backendSpec
	workers  int
	pages    int
	ideal    time.Duration
	why      string  // how ideal is reckoned
	floor    float64 // requests at the proxy per page no client can go under
	counting bool    // the limit counts its own denials
	clients  []string
}

const (
	proxyRRService   = 100 * time.Millisecond
	proxyConnService = 75 * time.Millisecond
)

// proxyCells is the suite. Each cell's ideal is what a client that knew
// the limit in advance would take: pages over the rate (less the burst a
// nodelay limit lets through at once), or pages times the service time over
// the slots.
func proxyCells() []proxyCell {
	var cells []proxyCell
	one := []backendSpec{{service: 0}}
	limitReq := func(rate, burst int, nodelay bool, status, workers, pages int) proxyCell {
		name := fmt.Sprintf("nginx limit_req %dr/s", rate)
		dir := "limit_req zone=z"
		excess := pages - 1
		why := fmt.Sprintf("(%d-1)/%d", pages, rate)
		if burst > 0 {
			name += fmt.Sprintf(" burst=%d", burst)
			dir += fmt.Sprintf(" burst=%d", burst)
			if nodelay {
				name += " nodelay"
				dir += " nodelay"
				excess -= burst
				why = fmt.Sprintf("(%d-1-%d)/%d", pages, burst, rate)
			}
		}
		statusDir := ""
		if status == 429 {
			statusDir = "limit_req_status 429;"
		}
		name += fmt.Sprintf(" %d w%d", status, workers)
		return proxyCell{
			name:  name,
			proxy: "nginx",
			conf: fmt.Sprintf("http: limit_req_zone $binary_remote_addr zone=z:1m rate=%dr/s;\nlocation: %s; %s",
				rate, dir, statusDir),
			backends: one,
			workers:  workers,
			pages:    pages,
			ideal:    time.Duration(excess) * time.Second / time.Duration(rate),
			why:      why + " s",
			floor:    1,
		}
	}
	for _, status := range []int{503, 429} {
		for _, w := range []int{1, 10, 30} {
			cells = append(cells, limitReq(10, 0, false, status, w, 100))
		}
	}
	for _, nodelay := range []bool{false, true} {
		cells = append(cells,
			limitReq(20, 10, nodelay, 503, 10, 200),
			limitReq(20, 10, nodelay, 503, 30, 200),
			limitReq(20, 10, nodelay, 429, 30, 200))
	}
	for _, w := range []int{10, 30} {
		cells = append(cells, proxyCell{
			name:     fmt.Sprintf("nginx limit_conn 5 w%d", w),
			proxy:    "nginx",
			conf:     "http: limit_conn_zone $binary_remote_addr zone=c:1m;\nlocation: limit_conn c 5;",
			backends: []backendSpec{{service: proxyConnService}},
			workers:  w,
			pages:    600,
			ideal:    600 * proxyConnService / 5,
			why:      "600 x 75 ms / 5",
			floor:    1,
		})
	}
	for _, broken := range []backendSpec{{status: 500}, {dead: true}} {
		name, conf := "nginx round robin 1 of 3 answers 500 w10", ""
		if broken.dead {
			// nginx by default would try the next upstream itself and
			// take the dead one out for 10 s: the client would see
			// nothing. Here each third request gets the 502.
			name, conf = "nginx round robin 1 of 3 closed port (502) w10",
				"location: proxy_next_upstream off;\nserver: max_fails=0"
		}
		cells = append(cells, proxyCell{
			name:     name,
			proxy:    "nginx",
			conf:     conf,
			backends: []backendSpec{{service: proxyRRService}, {service: proxyRRService}, broken},
			workers:  10,
			pages:    800,
			ideal:    800 * proxyRRService / 10,
			why:      "800 x 100 ms / 10 (a refusal costs no service time)",
			floor:    1.5, // one request in three lands on the broken member
			clients:  []string{"retryhttp-pace"},
		})
	}
	for _, w := range []int{10, 30} {
		cells = append(cells, proxyCell{
			name:     fmt.Sprintf("haproxy maxconn 5 queue 200ms w%d", w),
			proxy:    "haproxy",
			conf:     "defaults: timeout queue 200ms\nserver: maxconn 5",
			backends: []backendSpec{{service: proxyConnService}},
			workers:  w,
			pages:    600,
			ideal:    600 * proxyConnService / 5,
			why:      "600 x 75 ms / 5",
			floor:    1,
		})
	}
	for _, w := range []int{10, 30} {
		cells = append(cells, proxyCell{
			name:  fmt.Sprintf("haproxy stick-table 50/10s counts denials 429 w%d", w),
			proxy: "haproxy",
			conf: "frontend: stick-table type ip size 1k expire 30s store http_req_rate(10s)\n" +
				"frontend: http-request track-sc0 src\n" +
				"frontend: http-request deny deny_status 429 if { sc_http_req_rate(0) gt 50 }",
			backends: one,
			workers:  w,
			pages:    100,
			ideal:    10 * time.Second,
			why:      "(100-50) / (50/10 s)",
			floor:    1,
			counting: true,
		})
	}
	return cells
}

// proxyDeadline bounds a run: 2.5 x its ideal and 5 s.
func (c proxyCell) deadline() time.Duration { return c.ideal*5/2 + 5*time.Second }

// maxRequests bounds what one run may send the proxy: past it the run is
// cut.
func (c proxyCell) maxRequests() int { return 10*c.pages + 200 }
