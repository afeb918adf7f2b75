package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// opsWirings holds the applications asOpsBinary declared, by the variable
// that selects them, for runOps to build in this process.
var opsWirings = map[string]func(types testevents.Types, schema, value string) Wiring{}

// asOpsBinary declares the ops binary of an application that wire wires
// (given its event types, the schema and env's value). runOps runs its
// command tree in this process; when env is set, this test binary is that
// binary and exits with its exit code, for the few tests that need a
// separate process (what it reads from its own environment, such as
// $USER). Call it from an init function.
func asOpsBinary(env string, wire func(types testevents.Types, schema, value string) Wiring) {
	opsWirings[env] = wire
	v := os.Getenv(env)
	if v == "" {
		return
	}
	types := testevents.New()
	os.Exit(Main(Config{Registry: types.Registry, Wire: func(schema string) (Wiring, error) {
		return wire(types, schema, v), nil
	}}))
}

// runOps runs the command tree of the application asOpsBinary declared
// under env, with env's value value, in this process, as Main does
// (fresh event types, the error on standard error after the binary's
// name), and returns standard output, standard error and the exit code.
// It is a child process's outcome without the cost of starting one: the
// command tree keeps no state between runs, and its output goes to the
// writers cobra is given.
func runOps(ctx context.Context, env, value string, args ...string) (string, string, int) {
	wire, ok := opsWirings[env]
	if !ok {
		panic("no ops binary declared for " + env)
	}
	types := testevents.New()
	cfg := Config{Registry: types.Registry, Wire: func(schema string) (Wiring, error) {
		return wire(types, schema, value), nil
	}}
	var out, errOut bytes.Buffer
	code := Run(ctx, cfg, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// runOpsProcess runs the ops binary asOpsBinary declared under env as a
// separate process, with extra variables in its environment, and returns
// standard output, standard error and the exit code.
func runOpsProcess(t *testing.T, ctx context.Context, extra []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), extra...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// sagaWiring wires one saga, which build makes (for each store the
// command tree builds the sagas on), and no async projection.
func sagaWiring(build func() saga.Definition) Wiring {
	return Wiring{Sagas: func(*postgres.Store) ([]saga.Definition, error) { return []saga.Definition{build()}, nil }}
}
