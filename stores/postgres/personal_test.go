package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

type personalFixture struct {
	ctx   context.Context
	types testevents.PersonalTypes
	store *postgres.Store
}

func masterKey(t testing.TB, id, seed string) *postgres.MasterKey {
	t.Helper()
	m, err := postgres.NewMasterKey(id, testevents.MasterKey(seed))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func personalSetup(t *testing.T) personalFixture {
	t.Helper()
	types := testevents.NewPersonal()
	return personalFixture{ctx: context.Background(), types: types,
		store: pgtest.Store(t, types.Registry, postgres.Config{MasterKey: masterKey(t, "k1", "one")})}
}

// storeOn opens another store on f's schema, with its own master key.
func (f personalFixture) storeOn(t *testing.T, master *postgres.MasterKey) *postgres.Store {
	t.Helper()
	s, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry, MasterKey: master})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// countedPersonalSetup is personalSetup with the store on a pool of its
// own and conn one connection of it, held for the test; count counts the
// statements sent on conn only: a test of how many statements an append or
// a read sends runs them on conn, so nothing the store or the pool sends on
// another connection meanwhile is counted.
func countedPersonalSetup(t *testing.T) (f personalFixture, count *statementCounter, conn *pgxpool.Conn) {
	t.Helper()
	f = personalFixture{ctx: context.Background(), types: testevents.NewPersonal()}
	cfg := pgtest.PoolConfig(t)
	count = &statementCounter{}
	cfg.ConnConfig.Tracer = count
	var err error
	if f.store, err = postgres.New(f.ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: pgtest.Schema(t),
		Registry: f.types.Registry, MasterKey: masterKey(t, "k1", "one")}); err != nil {
		t.Fatal(err)
	}
	if conn, err = f.store.Pool().Acquire(f.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	count.only.Store(conn.Conn())
	return f, count, conn
}

// otherProcess opens another store on f's schema with f's master key over
// a pool of its own, as another process has: its statements are not
// counted (countedPersonalSetup) and its cache is its own.
func (f personalFixture) otherProcess(t *testing.T) *postgres.Store {
	t.Helper()
	s, err := postgres.New(f.ctx, pgtest.Pool(t), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry,
		MasterKey: masterKey(t, "k1", "one")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// register appends c to its customer's own stream of tenant through s.
func (f personalFixture) register(t *testing.T, s *postgres.Store, tenant string, c testevents.CustomerRegistered) error {
	t.Helper()
	return f.appendCustomer(s, projector.TenantStream(tenant, "customer", c.Customer), c)
}

// appendCustomer appends c to stream through s, in a transaction of its
// own.
func (f personalFixture) appendCustomer(s *postgres.Store, stream projector.StreamRef, c testevents.CustomerRegistered) error {
	return pgx.BeginFunc(f.ctx, s.Pool(), func(tx pgx.Tx) error {
		_, err := s.Append(f.ctx, tx, stream, projector.AnyVersion, c)
		return err
	})
}

// rawData returns every stored payload as text, keyed by event id, with
// its envelope kept apart (migration 29), if any, after it: the bytes as
// they are, so a value stored there in the clear would show.
func (f personalFixture) rawData(t *testing.T) map[string]string {
	t.Helper()
	rows, err := f.store.Pool().Query(f.ctx, `SELECT id::text, data::text || coalesce(' envelope ' || encode(envelope, 'escape'), '')
		FROM `+f.store.Table("projector_events"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var id, data string
	_, err = pgx.ForEachRow(rows, []any{&id, &data}, func() error { out[id] = data; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (f personalFixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT count(*) FROM `+f.store.Table(table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func readCustomer(t *testing.T, s *postgres.Store, tenant, id string) []projector.Event {
	t.Helper()
	evs, err := s.ReadStream(context.Background(), projector.TenantStream(tenant, "customer", id), postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestPersonalFieldsNeverInClear: the events table holds personal fields
// sealed; every read (stream, log, raw log) opens them.
func TestPersonalFieldsNeverInClear(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}
	if err := f.register(t, f.store, "acme", ada); err != nil {
		t.Fatal(err)
	}
	for _, data := range f.rawData(t) {
		if strings.Contains(data, "Ada") || strings.Contains(data, "ada@") {
			t.Fatalf("raw row holds personal data in the clear: %s", data)
		}
		if !strings.Contains(data, `"plan": "pro"`) || !strings.Contains(data, `"customer": "c-1"`) {
			t.Fatalf("raw row lost what is not personal: %s", data)
		}
	}
	evs := readCustomer(t, f.store, "acme", "c-1")
	if len(evs) != 1 || evs[0].Payload != ada || evs[0].Forgotten {
		t.Fatalf("read %+v", evs)
	}
	for _, raw := range []bool{false, true} {
		evs := readLogN(t, f.ctx, f.store, postgres.LogQuery{Raw: raw}, 1)
		if len(evs) != 1 || !strings.Contains(string(evs[0].Data), "ada@example.com") {
			t.Fatalf("raw=%v: log read %d events, the first %s", raw, len(evs), evs[0].Data)
		}
	}
	if n := f.count(t, "projector_subject_keys"); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
	if _, err := postgres.NewMasterKey("k1", []byte("short")); err == nil {
		t.Fatal("a short master key was accepted")
	}
	for _, bad := range []string{"", "k1", "k1:notbase64!", "k 1:" + strings.Repeat("A", 44), "k1:AAAA"} {
		if _, err := postgres.ParseMasterKey(bad); err == nil {
			t.Errorf("ParseMasterKey(%q) accepted", bad)
		}
	}
}

// TestNewSubjectRaceOneKey: two transactions appending for one new subject
// at once (the second waiting on the first's uncommitted key) end with one
// key, and both events open.
func TestNewSubjectRaceOneKey(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	tx1, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(f.ctx)
	first := testevents.CustomerRegistered{Customer: "c-9", Name: "First", Email: "1@x", Plan: "a"}
	if _, err := f.store.Append(f.ctx, tx1, projector.TenantStream("acme", "customer", "c-9"), projector.AnyVersion, first); err != nil {
		t.Fatal(err)
	}
	second := testevents.CustomerRegistered{Customer: "c-9", Name: "Second", Email: "2@x", Plan: "b"}
	done := make(chan error, 1)
	var pid uint32
	var mu sync.Mutex
	go func() {
		done <- pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			mu.Lock()
			pid = tx.Conn().PgConn().PID()
			mu.Unlock()
			// Another stream of the same subject: only the key is shared.
			_, err := f.store.Append(f.ctx, tx, projector.TenantStream("acme", "order", "o-1"), projector.AnyVersion, second)
			return err
		})
	}()
	// The second append waits on the first's key row.
	pgtest.Eventually(t, 10*time.Second, "the second append waits on the first's key", func() bool {
		mu.Lock()
		p := pid
		mu.Unlock()
		var waiting bool
		_ = f.store.Pool().QueryRow(f.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`, p).Scan(&waiting)
		return p != 0 && waiting
	})
	if err := tx1.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("second append: %v", err)
	}
	if n := f.count(t, "projector_subject_keys"); n != 1 {
		t.Fatalf("%d keys for one subject, want 1", n)
	}
	if evs := readCustomer(t, f.store, "acme", "c-9"); len(evs) != 1 || evs[0].Payload != first {
		t.Fatalf("first: %+v", evs)
	}
	evs, err := f.store.ReadStream(f.ctx, projector.TenantStream("acme", "order", "o-1"), postgres.StreamQuery{})
	if err != nil || len(evs) != 1 || evs[0].Payload != second {
		t.Fatalf("second: %+v %v", evs, err)
	}
}

// TestForgetSubject: after a forget, the subject's personal fields read as
// null (the event marked Forgotten) in every read; no stored row changed
// but the key's; another subject, of the same tenant or with the same id
// in another tenant, is intact. A second forget is refused, an unknown
// subject is not found; neither writes anything.
func TestForgetSubject(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
	bob := testevents.CustomerRegistered{Customer: "c-2", Name: "Bob", Email: "bob@x", Plan: "free"}
	twin := testevents.CustomerRegistered{Customer: "c-1", Name: "Twin", Email: "twin@x", Plan: "free"}
	for _, c := range []struct {
		tenant string
		c      testevents.CustomerRegistered
	}{{"acme", ada}, {"acme", bob}, {"globex", twin}, {"acme", ada}} {
		if err := f.register(t, f.store, c.tenant, c.c); err != nil {
			t.Fatal(err)
		}
	}
	before := f.rawData(t)

	res, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Event.Type != "subject.forgotten" || res.Event.Stream != projector.TenantStream("acme", projector.SubjectStreamType, "c-1") {
		t.Fatalf("forget result %+v", res)
	}
	after := f.rawData(t)
	if len(after) != len(before)+1 {
		t.Fatalf("%d events after forget, want %d", len(after), len(before)+1)
	}
	for id, data := range before {
		if after[id] != data {
			t.Fatalf("forget changed event %s: %s → %s", id, data, after[id])
		}
	}
	for _, ev := range readCustomer(t, f.store, "acme", "c-1") {
		p := ev.Payload.(testevents.CustomerRegistered)
		if !ev.Forgotten || p.Name != "" || p.Email != "" || p.Plan != "pro" || p.Customer != "c-1" {
			t.Fatalf("forgotten subject reads as %+v (forgotten %v)", p, ev.Forgotten)
		}
	}
	if evs := readCustomer(t, f.store, "acme", "c-2"); evs[0].Payload != bob || evs[0].Forgotten {
		t.Fatalf("bob: %+v", evs[0])
	}
	if evs := readCustomer(t, f.store, "globex", "c-1"); evs[0].Payload != twin || evs[0].Forgotten {
		t.Fatalf("the same id in another tenant: %+v", evs[0])
	}
	for _, ev := range readLogN(t, f.ctx, f.store, postgres.LogQuery{Raw: true}, len(after)) {
		if strings.Contains(string(ev.Data), "ada@") {
			t.Fatalf("log read after forget: %s", ev.Data)
		}
	}

	// An append after the forget writes the fields forgotten, not a new key.
	if err := f.register(t, f.store, "acme", ada); err != nil {
		t.Fatal(err)
	}
	evs := readCustomer(t, f.store, "acme", "c-1")
	if last := evs[len(evs)-1]; last.Payload.(testevents.CustomerRegistered).Email != "" || !last.Forgotten {
		t.Fatalf("append after forget reads %+v (forgotten %v), want the fields zero, forgotten", last.Payload, last.Forgotten)
	}
	if n := f.count(t, "projector_subject_keys"); n != 3 {
		t.Fatalf("%d key rows, want 3 (one a tombstone)", n)
	}

	events := f.count(t, "projector_events")
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("second forget: %v", err)
	}
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "nobody"}); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("unknown subject: %v", err)
	}
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "bad\x00id"}); !errors.Is(err, projector.ErrInvalidPayload) {
		t.Fatalf("NUL subject: %v", err)
	}
	// No tenant is no default: the error names the system tenant's constant.
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{ID: "c-2"}); !errors.Is(err, projector.ErrInvalidPayload) || !strings.Contains(err.Error(), "projector.SystemTenant") {
		t.Fatalf("subject without a tenant: %v", err)
	}
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme"}); !errors.Is(err, projector.ErrInvalidPayload) || !strings.Contains(err.Error(), "needs an id") {
		t.Fatalf("subject without an id: %v", err)
	}
	if n := f.count(t, "projector_events"); n != events {
		t.Fatalf("refused forgets wrote %d events", n-events)
	}
}

// TestSubjectIDLimit: an append whose subject id Forget could not take —
// over projector.MaxNameLength bytes, empty, with a NUL or invalid UTF-8 —
// is refused whole with ErrInvalidPayload naming the field, the length and
// the limit, and writes nothing (no key, no event); one at the limit is
// forgotten like any other. SealTx (snapshots, sagas' state) refuses the
// same ids.
func TestSubjectIDLimit(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	atLimit := strings.Repeat("L", projector.MaxNameLength)
	if err := f.register(t, f.store, "acme", testevents.CustomerRegistered{Customer: atLimit, Name: "Ada"}); err != nil {
		t.Fatalf("append with a %d-byte subject id: %v", len(atLimit), err)
	}
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: atLimit}); err != nil {
		t.Fatalf("forget a %d-byte subject id: %v", len(atLimit), err)
	}
	events, keys := f.count(t, "projector_events"), f.count(t, "projector_subject_keys")
	for _, tc := range []struct {
		name, id, want string
		sealed         bool // SealTx is checked too (json.Marshal turns invalid UTF-8 valid)
	}{
		{"256 bytes", strings.Repeat("L", 256), `the subject field "customer" is 256 bytes long, over the limit of 255`, true},
		{"100k bytes", strings.Repeat("K", 100_000), `the subject field "customer" is 100000 bytes long, over the limit of 255`, true},
		{"empty", "", `the subject field "customer" is empty`, true},
		{"NUL", "c\x00", "NUL", true},
		{"invalid UTF-8", "c\xff", `not valid UTF-8`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok := testevents.CustomerRegistered{Customer: "c-ok", Name: "Bob"}
			bad := testevents.CustomerRegistered{Customer: tc.id, Name: "Eve"}
			err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
				_, err := f.store.Append(f.ctx, tx, projector.TenantStream("acme", "customer", "c-ok"), projector.AnyVersion, ok, bad)
				return err
			})
			if !errors.Is(err, projector.ErrInvalidPayload) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("append: %v, want ErrInvalidPayload saying %q", err, tc.want)
			}
			if len(err.Error()) > 1000 {
				t.Fatalf("the error carries the id: %d bytes", len(err.Error()))
			}
			err = pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
				if !tc.sealed {
					return projector.ErrInvalidPayload
				}
				data, err := json.Marshal(bad)
				if err != nil {
					return err
				}
				_, err = f.store.SealTx(f.ctx, tx, "acme", projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}, data)
				return err
			})
			if !errors.Is(err, projector.ErrInvalidPayload) || tc.sealed && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SealTx: %v, want ErrInvalidPayload saying %q", err, tc.want)
			}
			if n, k := f.count(t, "projector_events"), f.count(t, "projector_subject_keys"); n != events || k != keys {
				t.Fatalf("a refused append wrote %d events and %d keys", n-events, k-keys)
			}
		})
	}
}

// TestForgetRacingOperators: forgets of one subject in concurrent
// transactions, the second waiting on the first's row lock: exactly one
// succeeds and one forgotten event is appended.
func TestForgetRacingOperators(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	if err := f.register(t, f.store, "acme", testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "a@x"}); err != nil {
		t.Fatal(err)
	}
	ref := postgres.SubjectRef{Tenant: "acme", ID: "c-1"}
	tx1, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(f.ctx)
	if _, err := f.store.ForgetTx(f.ctx, tx1, ref); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := f.store.Forget(f.ctx, ref); done <- err }()
	pgtest.Eventually(t, 10*time.Second, "the second forget waits on the first", func() bool {
		var n int
		_ = f.store.Pool().QueryRow(f.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE %projector_subject_keys%'`).Scan(&n)
		return n > 0
	})
	if err := tx1.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("the second forget: %v", err)
	}
	var forgotten int
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT count(*) FROM `+f.store.Table("projector_events")+` WHERE type = 'subject.forgotten'`).Scan(&forgotten); err != nil || forgotten != 1 {
		t.Fatalf("%d forgotten events (%v), want 1", forgotten, err)
	}
}

// TestMasterKeyMissingOrChanged: without a master key an append of
// personal data is refused with nothing written; with another master key
// (another id, or the same id with other key material) reads and appends
// fail with ErrMasterKeyChanged, never garbage, and nothing is written.
// Forgetting needs no master key.
func TestMasterKeyMissingOrChanged(t *testing.T) {
	// The store without a master key is opened with AllowNoMasterKey:
	// TestNewRefusesPersonalWithoutMasterKey is the refusal without it.
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "a@x"}
	none, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry, AllowNoMasterKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.register(t, none, "acme", ada); !errors.Is(err, postgres.ErrNoMasterKey) {
		t.Fatalf("append without a master key: %v", err)
	}
	if f.count(t, "projector_events") != 0 || f.count(t, "projector_subject_keys") != 0 {
		t.Fatal("a refused append wrote something")
	}
	if err := f.register(t, f.store, "acme", ada); err != nil {
		t.Fatal(err)
	}
	if _, err := none.ReadStream(f.ctx, projector.TenantStream("acme", "customer", "c-1"), postgres.StreamQuery{}); !errors.Is(err, postgres.ErrNoMasterKey) {
		t.Fatalf("read without a master key: %v", err)
	}
	for name, m := range map[string]*postgres.MasterKey{
		"another id":       masterKey(t, "k2", "one"),
		"same id, new key": masterKey(t, "k1", "two"),
	} {
		other := f.storeOn(t, m)
		if _, err := other.ReadStream(f.ctx, projector.TenantStream("acme", "customer", "c-1"), postgres.StreamQuery{}); !errors.Is(err, postgres.ErrMasterKeyChanged) {
			t.Fatalf("%s: read: %v", name, err)
		}
		if err := f.register(t, other, "acme", ada); !errors.Is(err, postgres.ErrMasterKeyChanged) {
			t.Fatalf("%s: append: %v", name, err)
		}
	}
	if f.count(t, "projector_events") != 1 {
		t.Fatal("a refused append wrote something")
	}
	if _, err := none.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatalf("forget without a master key: %v", err)
	}
	if evs := readCustomer(t, none, "acme", "c-1"); !evs[0].Forgotten {
		t.Fatalf("after forget, a store without a master key reads %+v", evs[0])
	}
}

// TestNewRefusesPersonalWithoutMasterKey: a registry declaring personal
// fields and no master key fail at New, naming the types, rather than at
// every append; AllowNoMasterKey (a process that only forgets or inspects),
// a key store of its own, or a registry without personal fields open.
func TestNewRefusesPersonalWithoutMasterKey(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	open := func(cfg postgres.Config) error {
		cfg.Schema = f.store.Schema()
		if cfg.Registry == nil {
			cfg.Registry = f.types.Registry
		}
		_, err := postgres.New(f.ctx, f.store.Pool(), cfg)
		return err
	}
	err := open(postgres.Config{})
	if !errors.Is(err, postgres.ErrNoMasterKey) || !strings.Contains(err.Error(), "event types customer.registered declare personal fields") {
		t.Fatalf("New without a master key: %v", err)
	}
	for name, cfg := range map[string]postgres.Config{
		"allowed":           {AllowNoMasterKey: true},
		"own key store":     {Keys: f.store.Keys()},
		"nothing personal":  {Registry: projector.NewRegistry()},
		"with a master key": {MasterKey: masterKey(t, "k1", "one")},
	} {
		if err := open(cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
