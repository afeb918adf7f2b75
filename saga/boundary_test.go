package saga_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector/saga"
)

// TestQueriesRefuseStringsPostgreSQLCannotHold: a saga name, tenant or key
// with a NUL byte or invalid UTF-8 is ErrInvalidArgument from List and
// Show before anything is sent, without the raw bytes in the message: it
// once reached the driver as "invalid byte sequence for encoding UTF8".
func TestQueriesRefuseStringsPostgreSQLCannotHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, bad := range []string{"a\xffb", "a\x00b", "\xc3"} {
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, saga.ErrInvalidArgument) {
				t.Fatalf("%s %q: %v, want ErrInvalidArgument", what, bad, err)
			}
			if strings.Contains(err.Error(), bad) {
				t.Fatalf("%s %q: the error carries the raw bytes: %q", what, bad, err)
			}
		}
		_, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: bad})
		check("List saga", err)
		_, err = saga.List(e.ctx, e.store, saga.ListQuery{Saga: "sla", Tenant: bad})
		check("List tenant", err)
		_, err = saga.Show(e.ctx, e.store, bad, "t", "k")
		check("Show saga", err)
		_, err = saga.Show(e.ctx, e.store, "sla", bad, "k")
		check("Show tenant", err)
		_, err = saga.Show(e.ctx, e.store, "sla", "t", bad)
		check("Show key", err)
	}
}
