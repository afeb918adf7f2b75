package cli

import (
	"os"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// asOpsBinary makes this test binary, when env is set, the ops binary of
// an application that wire wires (given its event types, the schema and
// env's value) and exits with its exit code: the tests run it as a
// separate process, the way an operator runs the real one. Call it from
// an init function.
func asOpsBinary(env string, wire func(types testevents.Types, schema, value string) Wiring) {
	v := os.Getenv(env)
	if v == "" {
		return
	}
	types := testevents.New()
	os.Exit(Main(Config{Registry: types.Registry, Wire: func(schema string) (Wiring, error) {
		return wire(types, schema, v), nil
	}}))
}

// sagaWiring wires one saga, which build makes (for each store the
// command tree builds the sagas on), and no async projection.
func sagaWiring(build func() saga.Definition) Wiring {
	return Wiring{Sagas: func(*postgres.Store) ([]saga.Definition, error) { return []saga.Definition{build()}, nil }}
}
