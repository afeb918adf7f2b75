package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "projector-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "projector")
	build := exec.Command("go", "build", "-race", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build projector:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	pgtest.Main(m)
}

type result struct {
	code           int
	stdout, stderr string
}

// run executes the built binary with args and the environment env (on top of
// a clean one: no inherited PROJECTOR_ variables).
func run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	// A command that should have exited but follows forever fails the
	// test instead of hanging the suite.
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

func TestVersion(t *testing.T) {
	t.Parallel()
	r := run(t, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "projector ") {
		t.Fatalf("version: %+v", r)
	}
}

func TestMigrateUpAndStatus(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	schema := newSchemaName(t)
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
}

// newSchemaName returns a name for a schema the binary will create, dropped
// when the test ends. It is in the pt_<unix>_ form the harness sweeps when
// a killed run left it behind, and it is dropped with a context of its own:
// t.Context() is already cancelled when cleanups run, which once left a
// schema behind on every run.
func newSchemaName(t *testing.T) string {
	t.Helper()
	schema := fmt.Sprintf("pt_%d_cli%d", time.Now().Unix(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		if _, err := pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// The schemas the binary creates in tests are gone when the test ends.
func TestCLISchemaDroppedAfterTest(t *testing.T) {
	t.Parallel()
	var schema string
	t.Run("creates", func(t *testing.T) {
		schema = newSchemaName(t)
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
