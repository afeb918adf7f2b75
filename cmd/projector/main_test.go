package main_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	projectorcmd "github.com/projectorhq/projector/cmd/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// binary is the projector binary the tests run: this test binary, under
// the name "projector" (a symbolic link), which TestMain turns into main.
// It is built with the test, in the suite's mode (-race under make test),
// so no second build and link of the command is needed.
var binary string

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "projector" {
		projectorcmd.Main() // exits
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "projector-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "projector")
	if err := os.Symlink(exe, binary); err != nil {
		fmt.Fprintln(os.Stderr, "link the projector binary:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	pgtest.Main(m)
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs the command line args in this process, as the binary would run
// it with the environment env (on top of a clean one: no inherited
// PROJECTOR_ variables), and returns its exit code and output. Starting a
// -race binary per command line cost the suite most of its CPU; tests of a
// process boundary (signals, start-up retries, daemons, exit on a crash)
// use runProcess or start the binary themselves.
func run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	// A command that should have exited but follows forever fails the
	// test instead of hanging the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	vars := map[string]string{"PATH": os.Getenv("PATH"), "HOME": os.TempDir()}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v // the last wins, as in a process's environment
	}
	var out, errOut syncBuffer
	code := projectorcmd.Run(ctx, args, func(k string) string { return vars[k] }, &out, &errOut)
	if ctx.Err() != nil {
		t.Fatalf("run %v: %v", args, ctx.Err())
	}
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// syncBuffer is a bytes.Buffer the command's goroutines (a logger, the
// example's welcome mails) may write to at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runProcess executes the built binary with args and the environment env
// (on top of a clean one: no inherited PROJECTOR_ variables), for the tests
// where the process is what is tested.
func runProcess(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return r
}

// The binary itself, as a process: main runs the command line it was
// started with and exits with its code.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := runProcess(t, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "projector ") {
		t.Fatalf("version: %+v", r)
	}
}

func TestMigrateUpAndStatus(t *testing.T) {
	t.Parallel()
	var schema string
	t.Run("cli", func(t *testing.T) {
		url := pgtest.URL(t)
		schema = pgtest.SchemaName(t, "cli")
		env := []string{"PROJECTOR_DATABASE_URL=" + url}

		r := run(t, env, "migrate", "status", "--schema", schema)
		if r.code != 0 || !strings.Contains(r.stdout, "pending") {
			t.Fatalf("status before: %+v", r)
		}
		r = run(t, env, "migrate", "up", "--schema", schema)
		if r.code != 0 || !strings.Contains(r.stdout, "applied migrations [1") {
			t.Fatalf("up: %+v", r)
		}
		r = run(t, append(env, "PROJECTOR_SCHEMA="+schema), "migrate")
		if r.code != 0 || !strings.Contains(r.stdout, "up to date") {
			t.Fatalf("up again (schema from the environment): %+v", r)
		}
		r = run(t, []string{}, "migrate", "status", "--schema", schema, "--database-url", url)
		if r.code != 0 || strings.Contains(r.stdout, "pending") {
			t.Fatalf("status after: %+v", r)
		}
	})
	// The schema the binary created is gone once the test that made it
	// ended: no run of the suite leaves one behind.
	if pgtest.SchemaExists(t, schema) {
		t.Errorf("schema %s leaked after its test", schema)
	}
}

// The schemas the binary creates in tests are gone when the test ends.
func TestCLISchemaDroppedAfterTest(t *testing.T) {
	t.Parallel()
	var schema string
	t.Run("creates", func(t *testing.T) {
		schema = pgtest.SchemaName(t, "cli")
		if r := run(t, []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t)}, "migrate", "--schema", schema); r.code != 0 {
			t.Fatalf("migrate: %+v", r)
		}
	})
	if pgtest.SchemaExists(t, schema) {
		t.Fatalf("schema %s outlived its test", schema)
	}
}

func TestBadCommandLines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  []string
		code int
		msg  string
	}{
		{"unknown flag", []string{"migrate", "--bogus"}, nil, 2, "unknown flag"},
		{"unknown command", []string{"frobnicate"}, nil, 2, "unknown command"},
		{"unknown subcommand", []string{"consumer", "frobnicate"}, nil, 2, "unknown command"},
		{"unknown events subcommand", []string{"events", "frobnicate"}, nil, 2, "unknown command"},
		{"extra argument", []string{"version", "extra"}, nil, 2, "unknown command"},
		{"no database", []string{"migrate", "status"}, nil, 2, "PROJECTOR_DATABASE_URL"},
		{"malformed url", []string{"migrate", "status", "--database-url", "postgres://%zz"}, nil, 2, "database url"},
		{"bad schema name", []string{"migrate", "--schema", "Robert'); DROP", "--database-url", "postgres://127.0.0.1:1/x"}, nil, 2, "--schema"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, run(t, tc.env, tc.args...), tc.code, tc.msg)
		})
	}
}

// wantError fails the test unless r exited with code and printed one line
// on standard error containing msg.
func wantError(t *testing.T, r result, code int, msg string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d: %+v", r.code, code, r)
	}
	if !strings.Contains(r.stderr, msg) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Fatalf("stderr %q: want one line containing %q", r.stderr, msg)
	}
}

// An unreachable database is a clear one-line error and a non-zero exit,
// quickly: nothing listens on port 1.
func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	start := time.Now()
	r := run(t, nil, "migrate", "status", "--database-url", "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2")
	if r.code != 1 || !strings.Contains(r.stderr, "cannot reach database at 127.0.0.1:1") {
		t.Fatalf("unreachable: %+v", r)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v to give up", d)
	}
}

// The stock binary pointed at a schema of its own does not adopt the
// example application: `status` records none of its inline projections
// (which would then refuse the application's own appends of those event
// types), and `run` creates none of its tables and registers none of its
// consumers (a registered consumer holds retention back for good). run fails
// instead, as a binary with no projections should; the example is wired only
// with PROJECTOR_EXAMPLE=1 (see the ops tests) or by `demo`.
func TestRunWithoutExampleAdoptsNothing(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	env := []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t), "PROJECTOR_SCHEMA=" + schema}
	if r := run(t, env, "status"); r.code != 0 {
		t.Fatalf("status: %+v", r)
	}
	cmd := exec.Command(binary, "run", "--http-addr", "")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	pgtest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// run either fails at once or, wired, says it is dispatching and keeps
	// going: stop it then, gracefully, and look at what it left.
	started := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if strings.Contains(lines.Text(), "dispatching") {
				close(started)
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-started:
		t.Errorf("run started dispatching in a schema that never asked for the example")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			err = <-exited
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatal("run neither failed nor started within a minute")
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("run without projections: %v, want exit 1; stderr %q", err, stderr.String())
	}

	ctx := context.Background()
	var tables []string
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 AND table_name NOT LIKE 'projector\_%' ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Errorf("run created the example's tables %v", tables)
	}
	var consumers int
	if err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "projector_consumers"}.Sanitize()).Scan(&consumers); err != nil {
		t.Fatal(err)
	}
	if consumers != 0 {
		t.Errorf("run registered %d consumers", consumers)
	}
	var inline int
	if err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "projector_inline_projections"}.Sanitize()).Scan(&inline); err != nil {
		t.Fatal(err)
	}
	if inline != 0 {
		t.Errorf("status and run recorded %d inline projections", inline)
	}
}

// PROJECTOR_EXAMPLE must be a boolean: a typo is an error, not a silent no.
// A process of its own: the binary reads the variable from its own
// environment.
func TestExampleVariableRefusesGarbage(t *testing.T) {
	t.Parallel()
	r := runProcess(t, []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t), "PROJECTOR_SCHEMA=" + pgtest.Schema(t), "PROJECTOR_EXAMPLE=yes please"}, "run", "--http-addr", "")
	wantError(t, r, 1, "PROJECTOR_EXAMPLE")
}
