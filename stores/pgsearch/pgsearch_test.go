package pgsearch_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestEnsureCreatesAndReplacesSettings: Ensure makes the table with its
// generated search and filter columns and GIN indexes; run again with the
// same settings it changes nothing; with a new filterable attribute it
// replaces the generated columns and keeps the documents, which the new
// filter then finds.
func TestEnsureCreatesAndReplacesSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	b, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idx := search.Index{Name: "tickets", Searchable: []string{"title"}, Filterable: []string{"status"}}
	if err := b.Ensure(ctx, idx); err != nil {
		t.Fatal(err)
	}
	table := store.Schema() + "." + pgsearch.TableName(idx)
	columns := func() map[string]int {
		t.Helper()
		rows, err := store.Pool().Query(ctx, `SELECT attname::text, attnum::int FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, table)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for rows.Next() {
			var name string
			var num int
			if err := rows.Scan(&name, &num); err != nil {
				t.Fatal(err)
			}
			out[name] = num
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := columns()
	for _, c := range []string{"tenant_id", "id", "doc", "search_text", "f_status"} {
		if _, ok := first[c]; !ok {
			t.Fatalf("table %s lacks column %s: %v", table, c, first)
		}
	}
	var gin int
	if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		WHERE i.indrelid = $1::regclass AND a.amname = 'gin'`, table).Scan(&gin); err != nil {
		t.Fatal(err)
	}
	if gin != 2 {
		t.Fatalf("%d GIN indexes on %s, want 2 (search text, status)", gin, table)
	}
	apply(t, store.Pool(), b, idx, search.Op{Kind: search.OpUpsert, Tenant: "acme", ID: "T-1",
		Doc: map[string]json.RawMessage{"id": json.RawMessage(`"T-1"`), "title": json.RawMessage(`"Printer jammed"`), "status": json.RawMessage(`"open"`), "priority": json.RawMessage(`"high"`)}})

	if err := b.Ensure(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if again := columns(); again["search_text"] != first["search_text"] {
		t.Fatalf("Ensure with unchanged settings remade the columns: %v, then %v", first, again)
	}

	idx.Filterable = append(idx.Filterable, "priority")
	if err := b.Ensure(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if _, ok := columns()["f_priority"]; !ok {
		t.Fatalf("no f_priority column after the settings changed: %v", columns())
	}
	got, err := search.Search[map[string]any](search.WithTenant(ctx, "acme"), search.Target(b, idx), "print", search.Eq("priority", "high"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0]["id"] != "T-1" {
		t.Fatalf("search by the new filter: %v, want T-1", got)
	}
}

// TestConfigRefused: a text search configuration that is not an
// identifier is refused by New; one PostgreSQL does not know fails Ensure
// with its name in the error, and creates nothing half-way.
func TestConfigRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	if _, err := pgsearch.New(store, pgsearch.Config{TextSearchConfig: "english'; DROP TABLE x; --"}); err == nil {
		t.Fatal("New accepted a text search configuration that is not an identifier")
	}
	b, err := pgsearch.New(store, pgsearch.Config{TextSearchConfig: "klingon"})
	if err != nil {
		t.Fatal(err)
	}
	idx := search.Index{Name: "tickets"}
	err = b.Ensure(ctx, idx)
	if err == nil || !strings.Contains(err.Error(), "klingon") {
		t.Fatalf("Ensure with an unknown configuration: %v", err)
	}
	var exists bool
	if err := store.Pool().QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, store.Schema()+"."+pgsearch.TableName(idx)).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("a failed Ensure left its table behind")
	}
	if err := b.Ensure(ctx, search.Index{Name: "Bad-Name"}); err == nil {
		t.Fatal("Ensure accepted an invalid index name")
	}
}

func apply(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, b *pgsearch.Backend, idx search.Index, ops ...search.Op) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := b.Apply(ctx, tx, idx, ops); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNewForSchemaBindsLate: a backend built from the schema name alone
// refuses Ensure and searches with ErrUnbound rather than guessing a
// database; EnsureOn works through the application's setup transaction,
// and after Bind searches work.
func TestNewForSchemaBindsLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	b, err := pgsearch.NewForSchema(store.Schema(), pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idx := search.Index{Name: "tickets", Filterable: []string{"status"}}
	if err := b.Ensure(ctx, idx); !errors.Is(err, pgsearch.ErrUnbound) {
		t.Fatalf("Ensure unbound: %v, want ErrUnbound", err)
	}
	if _, err := search.Search[map[string]any](search.WithTenant(ctx, "acme"), search.Target(b, idx), "x"); !errors.Is(err, pgsearch.ErrUnbound) {
		t.Fatalf("Search unbound: %v, want ErrUnbound", err)
	}
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error { return b.EnsureOn(ctx, tx, idx) }); err != nil {
		t.Fatal(err)
	}
	b.Bind(store.Pool())
	apply(t, store.Pool(), b, idx, search.Op{Kind: search.OpUpsert, Tenant: "acme", ID: "1",
		Doc: map[string]json.RawMessage{"id": json.RawMessage(`1`), "status": json.RawMessage(`"open"`)}})
	got, err := search.Search[map[string]any](search.WithTenant(ctx, "acme"), search.Target(b, idx), "", search.Eq("status", "open"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("after Bind: %v, want the one document", got)
	}
}

// TestGrantTenantRole: with a TenantRole the dispatcher writes the index
// as that role; GrantTenantRole lets it, and PostgreSQL then keeps each
// tenant-scoped transaction to its own tenant's documents: it sees only
// them, and writing another tenant's fails with a row-level-security
// violation.
func TestGrantTenantRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := projector.NewRegistry()
	opened, err := projector.Define[struct {
		Title string `json:"title"`
	}](types, "issue.opened")
	if err != nil {
		t.Fatal(err)
	}
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idx := search.Index{Name: "issues"}
	p := search.New("issue_search", search.Config{Index: idx, Backend: b})
	if err := search.On(p, opened, func(_ context.Context, ev projector.Event, e struct {
		Title string `json:"title"`
	}, w *search.Writer) error {
		return w.Upsert(map[string]string{"id": ev.Stream.ID, "title": e.Title})
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.GrantTenantRole(ctx, store.Pool(), idx, role); err != nil {
		t.Fatal(err)
	}
	if err := b.GrantTenantRole(ctx, store.Pool(), idx, role); err != nil {
		t.Fatalf("a second grant: %v", err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream(tenant, "issue", "I-1"), projector.NoStream, struct {
				Title string `json:"title"`
			}{"printer of " + tenant})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	async, err := p.Async()
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{async}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(cctx); err != nil {
		t.Fatal(err)
	}
	docs, err := b.Documents(ctx, idx)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 {
		t.Fatalf("indexed %v, want both tenants' I-1 (written as the tenant role)", docs)
	}
	table := store.Schema() + "." + pgsearch.TableName(idx)
	err = store.InTenantTx(ctx, "acme", func(ctx context.Context, tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			t.Errorf("acme's scoped transaction sees %d documents, want its 1", n)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (tenant_id, id, doc) VALUES ('globex', 'I-9', '{}')`)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("acme writing globex's document: %v, want a row-level-security violation (42501)", err)
	}
}
