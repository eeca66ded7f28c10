package redistest

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback in front of a redis-server, for the
// faults of the network between one process and Redis: a partition (Cut,
// Heal) and a slow link (SetLatency). Each connection through it is one
// connection to the server.
//
// A cut passes nothing either way, and refuses nothing: connections made
// during it are accepted and hang, as they would behind a partition. What
// was sent meanwhile passes when the cut heals, even from a client that
// has given up and closed, as TCP would retransmit it; so a command that
// timed out in its client still runs, late.
type Proxy struct {
	// Addr is where clients connect instead of the server.
	Addr   string
	target string
	ln     net.Listener
	done   chan struct{} // closed by Close

	mu     sync.Mutex
	open   chan struct{} // closed while the link is up; a cut makes a new one
	lo, hi time.Duration // latency added to each command, client to server
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// StartProxy starts a proxy to target, closed when tb ends.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, done: make(chan struct{}),
		open: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Cut stops everything from passing, until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already cut
	}
}

// Heal lets through what was held and what comes next.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// SetLatency holds each chunk the clients send for a random time between
// lo and hi before passing it on, in order; zero for both ends it.
func (p *Proxy) SetLatency(lo, hi time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lo, p.hi = lo, max(lo, hi)
}

// Close stops the proxy and ends every connection through it.
func (p *Proxy) Close() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(c, up, true)
		go p.pipe(up, c, false)
	}
}

// track records the two ends of a connection for Close, unless the proxy
// is closed already.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		for _, c := range conns {
			c.Close()
		}
		return false
	default:
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// chunk is what one read brought, and when it may pass on.
type chunk struct {
	b   []byte
	at  time.Time
	eof bool
}

// pipe copies from src to dst, through the cut and the latency when
// toServer. Reads go on while writes wait, so a client never blocks on a
// cut link, as it would not on a socket with room in its buffers.
func (p *Proxy) pipe(src, dst net.Conn, toServer bool) {
	defer p.wg.Done()
	q := make(chan chunk, 1024)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(q)
		var last time.Time
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				at := time.Now()
				if toServer {
					at = at.Add(p.delay())
				}
				if at.Before(last) {
					at = last // in order
				}
				last = at
				select {
				case q <- chunk{b: buf[:n], at: at}:
				case <-p.done:
					return
				}
			}
			if err != nil {
				select {
				case q <- chunk{eof: true, at: last}:
				case <-p.done:
				}
				return
			}
		}
	}()
	defer dst.Close()
	for c := range q {
		if !p.wait(c.at) {
			return
		}
		if c.eof {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// wait returns once the link is up and at has come, or false when the
// proxy closes first.
func (p *Proxy) wait(at time.Time) bool {
	for {
		p.mu.Lock()
		open := p.open
		p.mu.Unlock()
		select {
		case <-open:
		case <-p.done:
			return false
		}
		if d := time.Until(at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return false
			}
		}
		// A cut that came while waiting for at holds the chunk too.
		p.mu.Lock()
		still := p.open == open
		p.mu.Unlock()
		if still {
			return true
		}
	}
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	lo, hi := p.lo, p.hi
	p.mu.Unlock()
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo)
}
