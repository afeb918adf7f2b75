package main_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
)

// startupRun is a `projector run` process whose start-up is held: a test
// transaction locks the schema's migrations table, so the migration check
// waits on it.
type startupRun struct {
	cmd    *exec.Cmd
	lock   pgx.Tx
	mu     sync.Mutex
	stdout strings.Builder
	stderr strings.Builder
	exited chan error
}

func (r *startupRun) out() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stdout.String()
}

func startHeldRun(t *testing.T, o *opsEnv) *startupRun {
	t.Helper()
	ctx := context.Background()
	lock, err := pgtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	if _, err := lock.Exec(ctx, `LOCK TABLE `+pgx.Identifier{o.schema, "projector_migrations"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	r := &startupRun{lock: lock, exited: make(chan error, 1)}
	r.cmd = exec.Command(binary, "run", "--http-addr", "", "--instance-id", "startup-test")
	r.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, o.env...)
	r.cmd.Stderr = &r.stderr
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	pgtest.DieWithParent(r.cmd)
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	})
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			r.mu.Lock()
			r.stdout.WriteString(lines.Text() + "\n")
			r.mu.Unlock()
		}
		r.exited <- r.cmd.Wait()
	}()
	return r
}

// blocked returns the pid of the run's backend waiting on the lock.
func (r *startupRun) blocked(t *testing.T, o *opsEnv) int32 {
	t.Helper()
	var pid int32
	pgtest.Eventually(t, time.Minute, "run's migration check to wait on the lock", func() bool {
		err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND strpos(query, $1) > 0 AND strpos(query, 'projector_migrations') > 0 LIMIT 1`,
			o.schema).Scan(&pid)
		return err == nil
	})
	return pid
}

func (r *startupRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-r.exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(time.Minute):
		_ = r.cmd.Process.Kill()
		t.Fatalf("run did not exit within a minute:\n%s\n%s", r.out(), r.stderr.String())
		return -1
	}
}

// run's first connection, terminated while it checks the migrations, is
// retried with a logged backoff, and run comes up.
func TestRunRetriesStartUpConnection(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	r := startHeldRun(t, o)
	pid := r.blocked(t, o)
	var ok bool
	if err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate run's backend %d: %v, %v", pid, ok, err)
	}
	if err := r.lock.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, time.Minute, "run to start dispatching after its backend was terminated", func() bool {
		if r.cmd.ProcessState != nil || strings.Contains(r.out(), "dispatching") {
			return true
		}
		select {
		case err := <-r.exited:
			r.exited <- err
			return true
		default:
			return false
		}
	})
	if !strings.Contains(r.out(), "dispatching") {
		t.Fatalf("run exited after its start-up connection was terminated:\n%s\n%s", r.out(), r.stderr.String())
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, r.stderr.String())
	}
	if !strings.Contains(r.stderr.String(), "start-up failed; retrying") {
		t.Errorf("the retry was not logged:\n%s", r.stderr.String())
	}
}

// SIGTERM while run is starting up stops it with exit 0 and no error.
func TestRunSIGTERMDuringStartUpExitsQuietly(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	r := startHeldRun(t, o)
	r.blocked(t, o)
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := r.wait(t)
	if code != 0 || strings.Contains(r.stderr.String(), "context canceled") || strings.Contains(r.stderr.String(), "projector: ") {
		t.Fatalf("SIGTERM during start-up: exit %d, stderr:\n%s", code, r.stderr.String())
	}
}
