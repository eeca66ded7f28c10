package redistest

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StartCluster starts a Redis Cluster of masters masters with one replica
// each, on free loopback ports (--cluster-node-timeout 1000, so that a
// master killed is replaced within a few seconds), made by redis-cli
// --cluster create, and waits until every node reports cluster_state:ok and every replica
// has synced with its master.
// args are more configuration for every node. The nodes are stopped when
// the test ends.
func StartCluster(tb testing.TB, masters int, args ...string) []*Server {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Unavailable(tb, fmt.Errorf("redis-cli not installed: %w", err))
	}
	var nodes []*Server
	for range 2 * masters {
		a := append([]string{"--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
			"--cluster-config-file", "nodes.conf", "--repl-diskless-sync-delay", "0"}, args...)
		nodes = append(nodes, StartT(tb, a...))
	}
	create := []string{"--cluster", "create"}
	for _, n := range nodes {
		create = append(create, n.Addr)
	}
	create = append(create, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range nodes {
		for {
			// A replica that never synced would not be promoted.
			info, err := n.Cli("CLUSTER", "INFO")
			repl, rerr := n.Cli("INFO", "replication")
			if err == nil && rerr == nil && strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("cluster node %s not ok within 20s", n.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

// Cli runs redis-cli against the server with args, and returns its output.
func (s *Server) Cli(args ...string) (string, error) {
	host, port, _ := strings.Cut(s.Addr, ":")
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return string(out), err
}

// Crash kills the server with SIGKILL, as a machine lost would: it says
// nothing to anyone. Its port and directory are kept.
func (s *Server) Crash() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}
