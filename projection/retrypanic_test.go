package projection_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// panicking is consumer name's projection as a deploy whose handler panics
// on every event would have it.
func panicking(e *env, name string, cfg projection.AsyncConfig) *projection.Async {
	p := projection.NewAsync(name, cfg)
	h := func(context.Context, pgx.Tx, projector.Event) error { panic("handler panicked on purpose") }
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	return p
}

// A dead letter retried through a handler that panics fails like one whose
// handler returns an error: the panic is an error, recorded on the dead
// letter, which stays open with one more attempt; nothing is applied and
// the caller does not panic.
func TestDeadLetterRetryOfAPanickingHandler(t *testing.T) {
	t.Parallel()
	e, p, _, ids := deadLetterEnv(t)
	res, err := projection.RetryDeadLetter(e.ctx, e.store, panicking(e, "tolerant", p.Config()), ids[0], nil)
	if err != nil || res.Resolved || !strings.Contains(res.Error, "panic") || res.Attempts != 2 {
		t.Fatalf("retry through a panicking handler: %+v, %v; want unresolved with the panic as its error", res, err)
	}
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
	if err != nil || dl.Status != projection.DeadLetterOpen || dl.Attempts != 2 || !strings.Contains(dl.Error, "panicked on purpose") {
		t.Fatalf("after the panicking retry: %+v, %v; want it open with the panic recorded", dl, err)
	}
	if n := e.traced("tolerant", dl.EventID); n != 0 {
		t.Fatalf("a panicking retry left %d writes", n)
	}
}
