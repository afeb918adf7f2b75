package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childReady is the line a child prints once SIGTERM reaches its context
// instead of killing it (ChildContext). Before that line a SIGTERM is the
// default action, death by signal, which Terminate must not mistake for an
// unclean stop of a child that had not started yet.
const childReady = "pgtest: child handles SIGTERM"

// ChildContext is a child's main context: cancelled on SIGTERM or an
// interrupt. It tells the parent (on stderr) that from now on SIGTERM
// stops the child gracefully, so Terminate can wait for that first.
func ChildContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	fmt.Fprintln(os.Stderr, childReady)
	return ctx, stop
}

// ChildFailed is a child's exit when a step of its start or run fails with
// err: 1, after logging it, unless ctx was cancelled, which means a SIGTERM
// arrived meanwhile (the step failed because it was cancelled) and the
// child stops gracefully, with 0, as Terminate expects of a child
// terminated while it still starts.
func ChildFailed(ctx context.Context, logger *slog.Logger, msg string, err error) int {
	if ctx.Err() != nil {
		logger.Info(msg+": stopped by SIGTERM", "error", err)
		return 0
	}
	logger.Error(msg, "error", err)
	return 1
}

// Child is the test binary run again as a helper process — a dispatcher, a
// rebuilder — so a test can kill a real process (SIGKILL) or run several
// side by side. The child's TestMain recognises it by a variable in env and
// runs its part instead of the tests.
type Child struct {
	cmd  *exec.Cmd
	out  SyncBuffer
	done chan struct{}
}

// StartChild starts this test binary with env added to the environment and
// no tests selected. The test's end kills it if it still runs and, when the
// test failed, logs what it printed.
func StartChild(t testing.TB, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	DieWithParent(cmd)
	c := &Child{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &c.out, &c.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("child %d output:\n%s", cmd.Process.Pid, c.out.String())
		}
	})
	return c
}

// Kill SIGKILLs the child and waits for it to be gone.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	// A child that ended on its own just before (os.ErrProcessDone) is
	// as good as killed: Killed tells which it was.
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	<-c.done
}

// Terminate stops the child with SIGTERM and fails the test unless it
// exits cleanly within a minute. A child started with ChildContext gets
// the signal only once it handles it: a test that is done with a child
// before the child got that far (its work was done by those before it)
// would otherwise see it die by the signal.
func (c *Child) Terminate(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(c.out.String(), childReady) {
		select {
		case <-c.done:
			t.Fatalf("child %d ended before SIGTERM: %v\n%s", c.cmd.Process.Pid, c.cmd.ProcessState, c.out.String())
		case <-time.After(5 * time.Millisecond): // polling the child's output
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not install its SIGTERM handler within a minute\n%s", c.cmd.Process.Pid, c.out.String())
		}
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatalf("child %d did not stop within a minute of SIGTERM\n%s", c.cmd.Process.Pid, c.out.String())
	}
	if !c.cmd.ProcessState.Success() {
		t.Fatalf("child %d: %v\n%s", c.cmd.Process.Pid, c.cmd.ProcessState, c.out.String())
	}
}

// Done is closed when the child has ended.
func (c *Child) Done() <-chan struct{} { return c.done }

// Killed reports whether the child ended by SIGKILL (its own, or the test's).
func (c *Child) Killed() bool {
	if c.cmd.ProcessState == nil {
		return false
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// Succeeded reports whether the child has ended with exit code 0.
func (c *Child) Succeeded() bool {
	select {
	case <-c.done:
		return c.cmd.ProcessState.Success()
	default:
		return false
	}
}

// Output is what the child printed so far.
func (c *Child) Output() string { return c.out.String() }

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// SyncBuffer is a bytes.Buffer that a logger or a child process and the
// test reading it can share: tests of several packages need one.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p under the lock.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Eventually polls cond until it holds, failing the test once timeout has
// passed: waiting for a state another goroutine or process brings about,
// with a deadline, never a bare sleep.
//
// The interval starts at 5 ms and grows by half up to 50 ms: a state that
// comes at once is seen at once, and a wait of seconds (a child catching
// up, a horizon ageing) polls about twenty times a second instead of two
// hundred. Each poll is a query under the race detector, and the suite is
// CPU-bound: a tight loop there slows every other test of the run.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyExplained(t, timeout, what, cond, nil)
}

// EventuallyExplained is Eventually, and on a timeout it adds what
// explain returns (nil: nothing) to the failure: the state of the world
// when the wait gave up, such as the database's backends ([Activity]).
func EventuallyExplained(t testing.TB, timeout time.Duration, what string, cond func() bool, explain func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			if explain != nil {
				t.Fatalf("timed out after %v waiting for %s; then:\n%s", timeout, what, explain())
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval) // polling interval, not synchronisation
		interval = min(interval*3/2, maxPollInterval)
	}
}

// maxPollInterval bounds Eventually's interval: the most a test waits
// after its condition came true.
const maxPollInterval = 50 * time.Millisecond
