package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A proxyBackend is a net/http backend: it counts what it receives and
// answers "page N" after its service time, or its broken status at once.
type proxyBackend struct {
	srv      *httptest.Server
	addr     string // host:port; a closed port when dead
	requests atomic.Int64
}

// backendSpec describes one backend: its service time, a status it answers
// every request with (0: a 200 with the page), or dead (a closed port).
type backendSpec struct {
	service time.Duration
	status  int
	dead    bool
}

func startBackend(spec backendSpec) (*proxyBackend, error) {
	b := &proxyBackend{}
	if spec.dead {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		b.addr = fmt.Sprintf("127.0.0.1:%d", port)
		return b, nil
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.requests.Add(1)
		if spec.status != 0 {
			http.Error(w, "broken", spec.status)
			return
		}
		if spec.service > 0 {
			select {
			case <-time.After(spec.service):
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "page "+strings.TrimPrefix(r.URL.Path, "/page/"))
	}))
	b.addr = strings.TrimPrefix(b.srv.URL, "http://")
	return b, nil
}

func (b *proxyBackend) close() {
	if b.srv != nil {
		b.srv.Close()
	}
}

// freePort is a loopback port nothing listens on (at the time of asking).
func freePort() (int, error) {
	for range 200 {
		port := portsFrom + rand.IntN(portsSpan)
		if !givenPorts.give(port) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // another process's
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no loopback port free in the proxies' range")
}

// The proxies' ports come from below the kernel's ephemeral range (Linux:
// 32768 and up), where no listener on port 0 (a cell's backend, another
// test's server) and no outgoing connection is put. A port the kernel
// picked was free between its listener's close and the proxy's bind, and
// the next backend could get it: the proxy then failed to bind, and its
// client, finding the port open, sent to that backend direct.
const (
	portsFrom = 20000
	portsSpan = 10000
)

// givenPorts is the ports freePort handed out in this run, so that no two
// cells share one: a proxy that failed to bind while its client, finding
// the port open, sent to the other cell's proxy measured that proxy's
// limit shared (a host taken for down, once).
var givenPorts portBook

type portBook struct {
	mu    sync.Mutex
	given map[int]bool
}

func (b *portBook) give(port int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.given[port] {
		return false
	}
	if b.given == nil {
		b.given = map[int]bool{}
	}
	b.given[port] = true
	return true
}

// A proxyProc is one running proxy, owned by the test: killed at the end.
type proxyProc struct {
	cmd     *exec.Cmd
	dir     string
	port    int
	log     string // one line a request
	exited  chan struct{}
	waitErr error
}

// startProxy writes c's configuration under dir and starts the proxy on a
// free loopback port, then waits until the port answers.
func startProxy(bin string, c proxyCell, dir string, upstreams []string) (*proxyProc, error) {
	var lastErr error
	for range 3 { // a free port can be taken between asking and binding
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p := &proxyProc{dir: dir, port: port, exited: make(chan struct{})}
		stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
		if err != nil {
			return nil, err
		}
		switch c.proxy {
		case "nginx":
			conf := filepath.Join(dir, "nginx.conf")
			if err := os.WriteFile(conf, []byte(nginxConf(c, dir, port, upstreams)), 0o644); err != nil {
				return nil, err
			}
			p.log = filepath.Join(dir, "requests.log")
			os.Remove(filepath.Join(dir, "nginx.pid")) // a try before's: waitReady reads it as bound
			p.cmd = exec.Command(bin, "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "error.log"))
			p.cmd.Stdout = stderr
		case "haproxy":
			conf := filepath.Join(dir, "haproxy.cfg")
			if err := os.WriteFile(conf, []byte(haproxyConf(c, port, upstreams)), 0o644); err != nil {
				return nil, err
			}
			p.log = filepath.Join(dir, "requests.log")
			out, err := os.Create(p.log)
			if err != nil {
				return nil, err
			}
			p.cmd = exec.Command(bin, "-db", "-f", conf)
			p.cmd.Stdout = out
		}
		p.cmd.Stderr = stderr
		ownProcess(p.cmd)
		if err := p.cmd.Start(); err != nil {
			return nil, err
		}
		go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
		if err := p.waitReady(5 * time.Second); err != nil {
			p.stop()
			lastErr = err
			if strings.Contains(err.Error(), "in use") {
				// The next try's error log must hold its own errors
				// only: the cell reads it for [emerg] lines.
				os.Remove(filepath.Join(dir, "error.log"))
				continue
			}
			return nil, err
		}
		return p, nil
	}
	return nil, lastErr
}

func (p *proxyProc) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (%v): %s", filepath.Base(p.cmd.Path), p.waitErr, p.diagnostics())
		default:
		}
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.port), 200*time.Millisecond); err == nil {
			conn.Close()
			// The port answering may be another process's: nginx
			// writes its pid file only once it has bound its own.
			if filepath.Base(p.cmd.Path) != "nginx" || fileExists(filepath.Join(p.dir, "nginx.pid")) {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: port %d not answering after %v: %s", filepath.Base(p.cmd.Path), p.port, within, p.diagnostics())
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// diagnostics is what the proxy wrote to its error log and stderr.
func (p *proxyProc) diagnostics() string {
	var b []byte
	for _, f := range []string{"error.log", "stderr.log"} {
		d, _ := os.ReadFile(filepath.Join(p.dir, f))
		b = append(b, d...)
	}
	return shorten(strings.TrimSpace(string(b)), 600)
}

// stop ends the proxy: a graceful stop (nginx SIGQUIT, HAProxy SIGUSR1:
// the requests in flight end and are logged), SIGKILL after two seconds.
func (p *proxyProc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	sig := syscall.SIGQUIT
	if strings.Contains(filepath.Base(p.cmd.Path), "haproxy") {
		sig = syscall.SIGUSR1
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(2 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// lines counts the request log's lines so far.
func (p *proxyProc) lines() int {
	b, _ := os.ReadFile(p.log)
	return bytes.Count(b, []byte("\n"))
}

// proxyLog is what the request log says: requests by status, and the
// proxy's own refusals (answered without a server).
type proxyLog struct {
	requests int
	byStatus map[int]int
	own      int // answered by the proxy without reaching a backend
}

func (p *proxyProc) readLog() proxyLog {
	l := proxyLog{byStatus: map[int]int{}}
	f, err := os.Open(p.log)
	if err != nil {
		return l
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		status, err := strconv.Atoi(fields[0])
		if err != nil {
			continue
		}
		l.requests++
		l.byStatus[status]++
		if fields[1] == "-" || fields[1] == "<NOSRV>" || (len(fields) > 2 && strings.HasPrefix(fields[2], "sQ")) {
			l.own++
		}
	}
	return l
}

// proxyBinary finds nginx or haproxy: PROXIES_NGINX or PROXIES_HAPROXY
// when set (a path that is not an executable means none), else on PATH or in /usr/sbin (Debian's
// place, often not on a user's PATH).
func proxyBinary(name string) string {
	if p, ok := os.LookupEnv("PROXIES_" + strings.ToUpper(name)); ok {
		if fileExecutable(p) {
			return p
		}
		return ""
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := "/usr/sbin/" + name; fileExecutable(p) {
		return p
	}
	return ""
}

func fileExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
