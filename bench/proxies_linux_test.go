package bench

import (
	"os/exec"
	"syscall"
)

// ownProcess has the kernel kill the proxy when the test binary dies (a
// -timeout panic, a SIGKILL), so no nginx or HAProxy outlives its test.
func ownProcess(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
