// Package redistest gives tests a real redis-server on loopback.
//
// Addr returns the shared server for a test binary: the one at REDIS_ADDR
// (default 127.0.0.1:6390) when it answers, else one it starts itself on a
// free loopback port, once per test binary, and stops in Cleanup. Start
// gives a test a private server it may stop, freeze and restart.
//
// Where no server can be had (none answers, and redis-server is not
// installed), tests are skipped, except in CI (CI=true), where they fail:
// CI must never pass by testing nothing.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DefaultAddr is where the tests look for Redis when REDIS_ADDR is not set.
const DefaultAddr = "127.0.0.1:6390"

// EnvAddr names the variable that points the tests at a running Redis.
const EnvAddr = "REDIS_ADDR"

var (
	sharedOnce sync.Once
	sharedAddr string
	sharedErr  error
	sharedSrv  *Server
)

// Addr returns the address of a Redis for tests to share, or skips tb (fails
// it in CI) when there is none.
func Addr(tb testing.TB) string {
	tb.Helper()
	sharedOnce.Do(func() {
		addr := os.Getenv(EnvAddr)
		if addr == "" {
			addr = DefaultAddr
		}
		if Ping(addr, time.Second) == nil {
			sharedAddr = addr
			return
		}
		srv, err := Start(0)
		if err != nil {
			sharedErr = fmt.Errorf("no Redis answers at %s (set %s to point at one) and none could be started: %w",
				addr, EnvAddr, err)
			return
		}
		sharedSrv, sharedAddr = srv, srv.Addr
	})
	if sharedErr != nil {
		Unavailable(tb, sharedErr)
	}
	return sharedAddr
}

// Cleanup stops the shared server if Addr started one. Call it from
// TestMain after m.Run.
func Cleanup() {
	if sharedSrv != nil {
		sharedSrv.Stop()
	}
}

// Unavailable skips tb for a missing Redis, or fails it when CI=true.
func Unavailable(tb testing.TB, err error) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("redis unavailable in CI: %v", err)
	}
	tb.Skipf("skipping: %v (install redis-server, or set %s)", err, EnvAddr)
}

// InCI reports whether the tests run in CI, where a missing Redis fails.
func InCI() bool {
	v, _ := strconv.ParseBool(os.Getenv("CI"))
	return v
}

// Ping sends PING to addr over a raw connection and waits for +PONG.
func Ping(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("%s answered PING with %q", addr, strings.TrimSpace(line))
	}
	return nil
}

// Server is a redis-server that a test started, as a child process.
type Server struct {
	Addr string
	port int
	dir  string
	args []string // more configuration, as "--name", "value" pairs
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts redis-server on loopback, on port or, for 0, a free one,
// without persistence, and waits until it answers. args are more
// configuration for it ("--maxmemory", "10mb"), kept for Restart. DEBUG is
// enabled for local connections, for DebugSleep.
func Start(port int, args ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not installed: %w", err)
	}
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, dir: dir, args: args}
	if err := s.start(bin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// StartT is Start for one test: a missing redis-server skips it (fails it
// in CI), and the server is stopped when the test ends.
func StartT(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s, err := Start(0, args...)
	if err != nil {
		Unavailable(tb, err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start(bin string) error {
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", s.dir,
		"--loglevel", "warning")
	if debugConfigurable(bin) {
		cmd.Args = append(cmd.Args, "--enable-debug-command", "local")
	}
	cmd.Args = append(cmd.Args, s.args...)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := Ping(s.Addr, 200*time.Millisecond)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited at start (port busy?): %w", s.Addr, err)
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on %s did not answer within 5s: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the server and removes its directory.
func (s *Server) Stop() {
	s.kill()
	os.RemoveAll(s.dir)
}

// Kill ends the server (SIGTERM; its data is lost, nothing being saved)
// but keeps its port and directory for Restart.
func (s *Server) Kill() { s.kill() }

func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	p := s.cmd.Process
	p.Signal(syscall.SIGCONT) // a frozen server would not act on SIGTERM
	p.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(3 * time.Second):
		p.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() error {
	s.kill()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	// The port can be busy for a moment after the old process died.
	var last error
	for range 20 {
		if last = s.start(bin); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// DebugSleep makes the server sleep for d (DEBUG SLEEP), as a server
// blocked by a slow command would: it answers nothing meanwhile, and the
// commands sent to it run when it wakes. It returns once the server
// started sleeping.
func (s *Server) DebugSleep(d time.Duration) error {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return err
	}
	cmd := fmt.Sprintf("DEBUG SLEEP %.3f\r\n", d.Seconds())
	if _, err := c.Write([]byte(cmd)); err != nil {
		c.Close()
		return err
	}
	// The answer comes when the sleep ends: read it aside, so that an
	// error (DEBUG not allowed) is not lost, and close the connection.
	errc := make(chan error, 1)
	go func() {
		defer c.Close()
		c.SetDeadline(time.Now().Add(d + 5*time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "+OK") {
			err = fmt.Errorf("DEBUG SLEEP: %s", strings.TrimSpace(line))
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		return err // answered at once: refused
	case <-time.After(20 * time.Millisecond):
		return nil
	}
}

// debugConfigurable reports whether redis-server knows
// enable-debug-command (Redis 7 and later), which then must be set for
// DEBUG to be allowed.
func debugConfigurable(bin string) bool {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return false
	}
	_, v, ok := strings.Cut(string(out), " v=")
	if !ok {
		return false
	}
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 7
}

// Freeze stops the server process (SIGSTOP): connections stay open and
// nothing answers, as with a server that hangs.
func (s *Server) Freeze() error { return s.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) error {
	if s.cmd == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// freePort returns a loopback port that nothing listens on just now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
