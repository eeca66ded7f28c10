//go:build unix

package retryhttp

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// boundPort returns a loopback address whose port is bound by a socket
// that never listens, held until the test ends: every connection to it is
// refused, and no other test can be handed the port meanwhile (a port
// listened on and closed can be, by the next listener on ":0").
func boundPort(t testing.TB) (string, bool) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return "", false
	}
	sa := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return "", false
	}
	got, err := syscall.Getsockname(fd)
	in4, ok := got.(*syscall.SockaddrInet4)
	if err != nil || !ok {
		syscall.Close(fd)
		return "", false
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port)), true
}
