//go:build !linux

package bench

import "os/exec"

// ownProcess: only Linux can tie the proxy's life to the test binary's;
// elsewhere a proxy outlives a test binary that dies without its cleanup.
func ownProcess(*exec.Cmd) {}
