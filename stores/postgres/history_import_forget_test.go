package postgres_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// gatedCustomers is an inline read model of customers' names that forgets
// a subject's rows on its forgotten event. While gate is not zero, its
// apply of a customer.registered first waits for the advisory lock gate:
// a test holding that lock holds the appending (importing) transaction
// between its key read and its commit.
type gatedCustomers struct {
	table string
	gate  int64
}

func (g *gatedCustomers) Name() string                       { return "gated-customers" }
func (g *gatedCustomers) Validate(*projector.Registry) error { return nil }
func (g *gatedCustomers) ApplyInline(ctx context.Context, tx pgx.Tx, events []projector.Event) error {
	for _, ev := range events {
		switch p := ev.Payload.(type) {
		case testevents.CustomerRegistered:
			if g.gate != 0 {
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, g.gate); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+g.table+` (customer_id, name) VALUES ($1, $2)`, p.Customer, p.Name); err != nil {
				return err
			}
		case projector.SubjectForgotten:
			if _, err := tx.Exec(ctx, `DELETE FROM `+g.table+` WHERE customer_id = $1`, p.Subject); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestImportRacingForget: an import of a history file whose personal
// fields are sealed opens them with the subject's key and hands its inline
// projections the names in the clear; a forget of that subject committing
// while the import is under way (between its key read and its commit) must
// not leave the name in the read model (promise 19). The forget must wait
// for the import, as it waits for an append (its inline forget then deletes
// the imported row), or the import must see the subject forgotten.
//
// It failed before: the import read the key rows without a lock, so the
// forget committed in the gap, its inline forget deleting nothing, and the
// import then committed the name in the clear into the read model.
func TestImportRacingForget(t *testing.T) {
	t.Parallel()
	src, file := adaExported(t)
	ctx := src.ctx
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	model := &gatedCustomers{table: pgx.Identifier{schema, "gated_customers"}.Sanitize(), gate: rand.Int64N(1<<62) + 1}
	dst, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: src.types.Registry, MasterKey: masterKey(t, "k1", "one"),
		Inline: []postgres.InlineProjection{model}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+model.table+` (customer_id text NOT NULL, name text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+dst.Table("projector_subject_keys")+` SELECT * FROM `+src.store.Table("projector_subject_keys")); err != nil {
		t.Fatal(err)
	}

	// Hold the import's inline apply, after its key read, at the gate.
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock($1)`, model.gate); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock($1)`, model.gate); err != nil {
				t.Error(err)
			}
		}
	}
	defer release()
	imported := make(chan error, 1)
	go func() {
		_, err := dst.Import(ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{})
		imported <- err
	}()
	var importer int32
	pgtest.Eventually(t, 30*time.Second, "the import to wait at the gate", func() bool {
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, gate.Conn().PgConn().PID()).Scan(&importer)
		return err == nil
	})

	forgot := make(chan error, 1)
	go func() {
		_, err := dst.Forget(ctx, postgres.SubjectRef{Tenant: projector.SystemTenant, ID: "c-1"})
		forgot <- err
	}()
	// The forget either commits in the gap (what must not happen) or
	// waits for the import.
	var forgetFirst bool
	pgtest.Eventually(t, 30*time.Second, "the forget to finish or wait for the import", func() bool {
		select {
		case err := <-forgot:
			forgot <- err
			forgetFirst = true
			return true
		default:
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))`, importer).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	release()
	if err := <-imported; err != nil {
		t.Fatalf("import: %v", err)
	}
	if err := <-forgot; err != nil {
		t.Fatalf("forget: %v", err)
	}
	var names []string
	rows, err := pool.Query(ctx, `SELECT coalesce(name, '') FROM `+model.table+` WHERE customer_id = 'c-1' AND name IS NOT NULL AND name <> ''`)
	if err != nil {
		t.Fatal(err)
	}
	if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("after the forget committed (before the import did: %v), the read model holds the forgotten subject's name %q", forgetFirst, names)
	}
}
