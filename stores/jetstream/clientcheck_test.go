package jetstream_test

import (
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// A claims consumer killed while its handler waits for a lock does not
// leave its backend behind holding the claim and the stream's row until
// the wait ends (every later delivery of the stream would wait on them):
// the transaction's backend checks its client every second
// (internal/clientcheck) and ends. Without the check it waited for as long
// as the test held the table.
func TestKilledConsumersWaitingBackendEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	if _, err := r.Ensure(e.ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	e.jsConsumer("p18")
	tx, err := snk.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+snk.effects+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	e.publish(r, comments(projector.TenantStream("acme", "ticket", "k1"), 1)[0])
	child := pgtest.StartChild(t, claimsChildEnv(e, "park", snk.store.Schema(), "p18")...)
	pgtest.WaitForLockOn(t, snk.store.Pool(), snk.effects) // the child's handler waits for the table
	child.Kill(t)
	if !pgtest.NoLockWaitersWithin(t, snk.store.Pool(), snk.effects, 20*time.Second) {
		t.Fatal("the killed consumer's backend still waits for the table 20 s after the kill, holding its claim and stream row")
	}
	// Its stream's row went with it: the test takes it at once.
	if _, err := tx.Exec(e.ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM `+snk.store.Table("projector_jetstream_streams")+` WHERE subscription = 'p18' FOR UPDATE`); err != nil {
		t.Fatalf("the stream's row after the killed consumer's backend ended: %v", err)
	}
}
