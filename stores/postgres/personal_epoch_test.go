package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// keyProbes returns how many scans of the key table's primary key tx has
// made so far: PostgreSQL's not yet reported counts of the transaction.
func keyProbes(t *testing.T, ctx context.Context, tx pgx.Tx, s *postgres.Store) int64 {
	t.Helper()
	var n int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_numscans($1::regclass)`,
		s.Schema()+".projector_subject_keys_pkey").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSealedReadTrustsConfirmedKeys: once a read has seen the subjects' key
// rows, and no key was destroyed since (the key epoch did not move), a read
// of their sealed events looks up no key row — stream and log reads both —
// and still opens every field.
func TestSealedReadTrustsConfirmedKeys(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	var people []testevents.CustomerRegistered
	for _, id := range []string{"c-1", "c-2", "c-3"} {
		c := testevents.CustomerRegistered{Customer: id, Name: "Name " + id, Email: id + "@x", Plan: "pro"}
		people = append(people, c)
		if err := f.appendCustomer(f.store, projector.TenantStream("acme", "customer", "all"), c); err != nil {
			t.Fatal(err)
		}
	}
	readLogN(t, f.ctx, f.store, postgres.LogQuery{}, 3) // the log holds them
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	check := func(evs []projector.Event) {
		t.Helper()
		if len(evs) != 3 {
			t.Fatalf("read %d events, want 3", len(evs))
		}
		for i, ev := range evs {
			if ev.Payload != people[i] || ev.Forgotten {
				t.Fatalf("event %d: %+v (forgotten %v)", i, ev.Payload, ev.Forgotten)
			}
		}
	}
	read := func() {
		t.Helper()
		evs, err := f.store.ReadStreamTx(f.ctx, tx, projector.TenantStream("acme", "customer", "all"), postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		check(evs)
		b, err := f.store.ReadLogTx(f.ctx, tx, postgres.LogQuery{})
		if err != nil {
			t.Fatal(err)
		}
		check(b.Events)
	}
	read() // sees the key rows (the keys the appends cached are not trusted)
	before := keyProbes(t, f.ctx, tx, f.store)
	read()
	if n := keyProbes(t, f.ctx, tx, f.store) - before; n != 0 {
		t.Errorf("reads of sealed events whose keys were seen at the current epoch probed the key table %d times, want 0", n)
	}
}

// TestKeyEpochMovesOnEveryKeyDestruction: whatever destroys a key — a
// forget, a key row deleted or the key table truncated by hand — moves the
// epoch in its own transaction, so a store whose cache holds the key and
// trusts it reads the subject's fields as forgotten from that commit on,
// never opened with the key it remembers.
func TestKeyEpochMovesOnEveryKeyDestruction(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		destroy func(f personalFixture, other *postgres.Store, subject string) error
	}{
		{"forget", func(f personalFixture, other *postgres.Store, subject string) error {
			_, err := other.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: subject})
			return err
		}},
		{"delete", func(f personalFixture, _ *postgres.Store, subject string) error {
			_, err := f.store.Pool().Exec(f.ctx, `DELETE FROM `+f.store.Table("projector_subject_keys")+` WHERE subject = $1`, subject)
			return err
		}},
		{"truncate", func(f personalFixture, _ *postgres.Store, _ string) error {
			_, err := f.store.Pool().Exec(f.ctx, `TRUNCATE `+f.store.Table("projector_subject_keys"))
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := personalSetup(t)
			other := f.storeOn(t, masterKey(t, "k1", "one"))
			ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
			if err := f.register(t, f.store, "acme", ada); err != nil {
				t.Fatal(err)
			}
			for range 2 { // the second read trusts the key the first one saw
				if evs := readCustomer(t, f.store, "acme", "c-1"); len(evs) != 1 || evs[0].Payload != ada {
					t.Fatalf("before: %+v", evs)
				}
			}
			if err := c.destroy(f, other, "c-1"); err != nil {
				t.Fatal(err)
			}
			for _, ev := range readCustomer(t, f.store, "acme", "c-1") {
				if p := ev.Payload.(testevents.CustomerRegistered); !ev.Forgotten || p.Name != "" || p.Email != "" {
					t.Fatalf("after the key was destroyed (%s): %+v (forgotten %v)", c.name, p, ev.Forgotten)
				}
			}
			for _, ev := range readLogN(t, f.ctx, f.store, postgres.LogQuery{}, 1) {
				if strings.Contains(string(ev.Data), "ada@") {
					t.Fatalf("a log read after the key was destroyed (%s): %s", c.name, ev.Data)
				}
			}
		})
	}
}

// TestTrustedKeyFromRolledBackTransaction: a read inside a transaction sees
// the key that transaction created and remembers it at the current epoch;
// the transaction rolls back and another creates the subject's key. The
// remembered key does not open the other key's fields, and the read falls
// back to the key table instead of failing.
func TestTrustedKeyFromRolledBackTransaction(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-9", Name: "Ada", Email: "ada@x", Plan: "pro"}
	stream := projector.TenantStream("acme", "customer", "c-9")
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Append(f.ctx, tx, stream, projector.AnyVersion, ada); err != nil {
		t.Fatal(err)
	}
	if evs, err := f.store.ReadStreamTx(f.ctx, tx, stream, postgres.StreamQuery{}); err != nil || len(evs) != 1 || evs[0].Payload != ada {
		t.Fatalf("read in the transaction: %+v, %v", evs, err)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	other := f.storeOn(t, masterKey(t, "k1", "one"))
	if err := f.register(t, other, "acme", ada); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if evs := readCustomer(t, f.store, "acme", "c-9"); len(evs) != 1 || evs[0].Payload != ada || evs[0].Forgotten {
			t.Fatalf("after the rolled-back key: %+v", evs)
		}
	}
}

// TestKeyEpochOfRolledBackForget: a forget that rolls back moved the epoch
// in its transaction, and a read there trusted another subject's key at
// that epoch; a later forget of that subject, which commits, must not take
// the same epoch value, or the key would be trusted after it.
func TestKeyEpochOfRolledBackForget(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	other := f.storeOn(t, masterKey(t, "k1", "one"))
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
	bob := testevents.CustomerRegistered{Customer: "c-2", Name: "Bob", Email: "bob@x", Plan: "pro"}
	for _, c := range []testevents.CustomerRegistered{ada, bob} {
		if err := f.register(t, f.store, "acme", c); err != nil {
			t.Fatal(err)
		}
		readCustomer(t, f.store, "acme", c.Customer)
	}
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.ForgetTx(f.ctx, tx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	if evs, err := f.store.ReadStreamTx(f.ctx, tx, projector.TenantStream("acme", "customer", "c-2"), postgres.StreamQuery{}); err != nil || len(evs) != 1 || evs[0].Payload != bob {
		t.Fatalf("read in the forget's transaction: %+v, %v", evs, err)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-2"}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range readCustomer(t, f.store, "acme", "c-2") {
		if p := ev.Payload.(testevents.CustomerRegistered); !ev.Forgotten || p.Name != "" {
			t.Fatalf("after the committed forget: %+v (forgotten %v)", p, ev.Forgotten)
		}
	}
}

// TestSealedReadAfterTheEpochMoved: a process reads two subjects' events
// with the keys it trusts, the key epoch alone in the statement; another
// process forgets one subject. The next read sees the epoch move, trusts
// neither cached key, and reads both keys in one more statement: the
// forgotten subject's fields are null, the other's open. A read after it
// trusts the other subject's key at the new epoch again.
func TestSealedReadAfterTheEpochMoved(t *testing.T) {
	t.Parallel()
	f, count, conn := countedPersonalSetup(t)
	ctx, store, other := f.ctx, f.store, f.otherProcess(t)
	both, bobs := projector.TenantStream("acme", "customer", "both"), projector.TenantStream("acme", "customer", "c-2")
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
	bob := testevents.CustomerRegistered{Customer: "c-2", Name: "Bob", Email: "bob@x", Plan: "pro"}
	for _, a := range []struct {
		stream projector.StreamRef
		c      testevents.CustomerRegistered
	}{{both, ada}, {both, bob}, {bobs, bob}} {
		if err := f.appendCustomer(store, a.stream, a.c); err != nil {
			t.Fatal(err)
		}
	}
	read := func(stream projector.StreamRef, want int64) []projector.Event {
		t.Helper()
		start := count.n.Load()
		evs, err := store.ReadStreamTx(ctx, conn, stream, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if n := count.n.Load() - start; n != want {
			t.Errorf("the read of %s sent %d statements, want %d", stream, n, want)
		}
		return evs
	}
	read(both, 1) // brings the key rows: the process knows no epoch yet
	if evs := read(both, 1); len(evs) != 2 || evs[0].Payload != ada || evs[1].Payload != bob {
		t.Fatalf("before the forget: %+v", evs)
	}
	if _, err := other.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	evs := read(both, 2)
	if len(evs) != 2 || !evs[0].Forgotten || evs[0].Payload.(testevents.CustomerRegistered).Name != "" || evs[1].Payload != bob || evs[1].Forgotten {
		t.Fatalf("after the forget: %+v", evs)
	}
	if evs := read(bobs, 1); len(evs) != 1 || evs[0].Payload != bob {
		t.Fatalf("the other subject after the forget: %+v", evs)
	}
}

// TestForgottenSubjectReadAtOneEpoch: once a read has found a subject
// forgotten, a read at the same key epoch takes it as forgotten without
// reading its key row again (one statement, the key epoch's alone), and a
// move of the epoch ends that: a key put back by hand (an UPDATE of the
// row, which moves the epoch) opens the subject's fields on the next read.
func TestForgottenSubjectReadAtOneEpoch(t *testing.T) {
	t.Parallel()
	f, count, conn := countedPersonalSetup(t)
	ctx, store, other := f.ctx, f.store, f.otherProcess(t)
	both := projector.TenantStream("acme", "customer", "both")
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
	bob := testevents.CustomerRegistered{Customer: "c-2", Name: "Bob", Email: "bob@x", Plan: "pro"}
	for _, c := range []testevents.CustomerRegistered{ada, bob} {
		if err := f.appendCustomer(store, both, c); err != nil {
			t.Fatal(err)
		}
	}
	read := func(want int64) []projector.Event {
		t.Helper()
		start := count.n.Load()
		evs, err := store.ReadStreamTx(ctx, conn, both, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if n := count.n.Load() - start; n != want {
			t.Errorf("the read sent %d statements, want %d", n, want)
		}
		if len(evs) != 2 || evs[1].Payload != bob || evs[1].Forgotten {
			t.Fatalf("the other subject's event: %+v", evs)
		}
		return evs
	}
	forgotten := func(evs []projector.Event) bool {
		return evs[0].Forgotten && evs[0].Payload.(testevents.CustomerRegistered).Name == ""
	}
	read(1) // brings the key rows: the process knows no epoch yet
	var wrapped []byte
	if err := other.Pool().QueryRow(ctx, `SELECT wrapped FROM `+store.Schema()+`.projector_subject_keys WHERE subject = 'c-1'`).Scan(&wrapped); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	if evs := read(2); !forgotten(evs) { // the epoch moved: both keys read again
		t.Fatalf("after the forget: %+v", evs)
	}
	if evs := read(1); !forgotten(evs) { // the same epoch: c-1 known forgotten
		t.Fatalf("after the forget, again: %+v", evs)
	}
	if _, err := other.Pool().Exec(ctx, `UPDATE `+store.Schema()+`.projector_subject_keys SET wrapped = $1, forgotten_at = NULL WHERE subject = 'c-1'`, wrapped); err != nil {
		t.Fatal(err)
	}
	if evs := read(2); evs[0].Forgotten || evs[0].Payload != ada {
		t.Fatalf("after the key was put back (the epoch moved): %+v", evs)
	}
}
