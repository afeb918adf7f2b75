package projection_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Queued writes go out pipelined and land exactly like direct ones; a
// queued statement that fails is pinned on the event that queued it.
func TestQueuedWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	counts := e.table("counts")
	e.exec(`ALTER TABLE ` + counts + ` ADD CONSTRAINT no_poison CHECK (stream_id <> 'poison')`)
	upsert := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ('queued', $1, 1, $2)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1, last_version = $2,
			bad = c.bad + CASE WHEN c.last_version = $2 - 1 THEN 0 ELSE 1 END`
	p := projection.NewAsync("queued", projection.AsyncConfig{BatchSize: 50, MaxAttempts: 1})
	h := func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
		return projection.Queue(ctx, upsert, ev.Stream.ID, ev.Version)
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := e.appendMany(2, 600, 20)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("queued", versions)

	// The check constraint refuses the poison stream's row: the event that
	// queued it fails, the events before it in the batch commit.
	before := e.appendOne("z-before", projector.NoStream, testevents.TicketOpened{Title: "ok"})[0]
	bad := e.appendOne("poison", projector.NoStream, testevents.TicketOpened{Title: "x"})[0]
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the shard to die on the queued write", func() bool { return e.status(admin, "queued").Status == projection.StatusDead })
	st := e.status(admin, "queued")
	if st.FailedEventID != bad.ID || !strings.Contains(st.LastError, "no_poison") {
		t.Fatalf("failing event %s (%q), want the poison %s", st.FailedEventID, st.LastError, bad.ID)
	}
	if got, _ := e.counts("queued"); got["z-before"] != 1 {
		t.Fatalf("the event before the poison was not committed: %v", got["z-before"])
	}
	_ = before

	if err := projection.Queue(e.ctx, "SELECT 1"); !errors.Is(err, projection.ErrNoDispatcher) {
		t.Fatalf("Queue outside a handler: %v", err)
	}
}

// Queued writes run under the tenant of the event that queued them, so
// row-level security holds for them too.
func TestQueuedWritesAreTenantScoped(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, notes := pgtest.TenantRole(t, schema)
	store, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: context.Background(), types: types, schema: schema, store: store}
	p := projection.NewAsync("notes", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors})
	must(projection.On(p, types.Opened, func(ctx context.Context, _ pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		// The title says which tenant's row to write: a's own, or b's.
		return projection.Queue(ctx, `INSERT INTO `+notes+` VALUES ($1, $2)`, o.Title, ev.Stream.ID)
	}))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	for _, c := range []struct{ tenant, id, title string }{{"a", "own", "a"}, {"a", "forged", "b"}, {"b", "own-b", "b"}} {
		if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(e.ctx, tx, projector.TenantStream(c.tenant, "ticket", c.id), projector.NoStream, testevents.TicketOpened{Title: c.title})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := store.Pool().Query(e.ctx, `SELECT tenant_id || ':' || body FROM `+notes+` ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "a:own,b:own-b" {
		t.Fatalf("notes %v: the forged row must have been refused", got)
	}
	var errText string
	if err := store.Pool().QueryRow(e.ctx, `SELECT error FROM `+store.Table("projector_dead_letters")+` WHERE stream_id = 'forged'`).Scan(&errText); err != nil || !strings.Contains(errText, "row-level security") {
		t.Fatalf("dead letter for the forged write: %q %v", errText, err)
	}
}
