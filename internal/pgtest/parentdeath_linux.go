package pgtest

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process receive SIGKILL when the test binary
// that starts it dies: a binary killed by `go test -timeout` (or by a
// developer's ^C) runs no cleanup, and a child dispatcher, rebuilder or
// relay left behind would go on holding connections of the server's budget
// and applying events into the next run's schemas. Call it before Start.
//
// The signal is tied to the OS thread that forked the child, not the
// process; the Go runtime keeps its threads for the process's life unless a
// goroutine that locked one exits, which these tests never do.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
