//go:build !linux

package pgtest

import "os/exec"

// DieWithParent is a no-op where the kernel has no parent-death signal: a
// child of a test binary killed by its timeout must then be stopped by hand.
func DieWithParent(cmd *exec.Cmd) {}
