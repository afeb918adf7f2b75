package projection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
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

// appendStreams appends one opened event to each of the streams ids, in
// one transaction: they are read in that order, in one batch when it is
// large enough.
func (e *env) appendStreams(ids []string) {
	e.t.Helper()
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		for _, id := range ids {
			if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream, testevents.TicketOpened{Title: id}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// A batch larger than what the dispatcher lets gather before it streams
// queued writes on: a failing write sent long before the batch's end still
// fails exactly the event that queued it. In halt mode the events before it
// commit and none after it; in continuous mode it alone is dead-lettered.
// Half the statements use pgx.NamedArgs, which the stream rewrites as pgx
// would.
func TestQueuedWritesStreamedFailure(t *testing.T) {
	t.Parallel()
	for _, mode := range []projection.ErrorMode{projection.HaltOnError, projection.SkipApplyErrors} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			counts := e.table("counts")
			e.exec(`ALTER TABLE ` + counts + ` ADD CONSTRAINT no_poison CHECK (stream_id <> 'poison')`)
			upsert := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ('streamed', $1, 1, 1)
				ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1`
			named := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ('streamed', @stream, 1, 1)
				ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1`
			p := projection.NewAsync("streamed", projection.AsyncConfig{BatchSize: 500, MaxAttempts: 1, ErrorMode: mode})
			must(projection.OnEvent(p, e.types.Opened, func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
				if ev.Stream.ID == "boom" {
					return errors.New("boom")
				}
				if ev.Version%2 == 0 || strings.HasSuffix(ev.Stream.ID, "1") {
					return projection.Queue(ctx, named, pgx.NamedArgs{"stream": ev.Stream.ID})
				}
				return projection.Queue(ctx, upsert, ev.Stream.ID)
			}))
			// 300 events; the poison is the 101st: its write goes out with
			// the second chunk, well before the batch's end, and before the
			// handler of the 251st fails: PostgreSQL stopped at the poison.
			var ids []string
			for i := range 300 {
				id := fmt.Sprintf("q-%03d", i)
				switch i {
				case 100:
					id = "poison"
				case 250:
					id = "boom"
				}
				ids = append(ids, id)
			}
			e.appendStreams(ids)
			d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
			admin := projection.NewAdmin(e.store)
			if mode == projection.HaltOnError {
				eventually(t, time.Minute, "the shard to die on the streamed write", func() bool { return e.status(admin, "streamed").Status == projection.StatusDead })
				st := e.status(admin, "streamed")
				if !strings.Contains(st.LastError, "no_poison") {
					t.Fatalf("last error %q, want the poison's check violation", st.LastError)
				}
				got, _ := e.counts("streamed")
				for i, id := range ids {
					if want := int64(min(1, max(0, 100-i))); got[id] != want {
						t.Fatalf("stream %s (event %d) applied %d times, want %d", id, i, got[id], want)
					}
				}
				return
			}
			ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
			defer cancel()
			if err := d.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			got, _ := e.counts("streamed")
			for i, id := range ids {
				if want := int64(1); (i == 100 || i == 250) && got[id] != 0 || i != 100 && i != 250 && got[id] != want {
					t.Fatalf("stream %s (event %d) applied %d times", id, i, got[id])
				}
			}
			rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id || ': ' || error FROM `+e.store.Table("projector_dead_letters")+` ORDER BY event_seq`)
			if err != nil {
				t.Fatal(err)
			}
			letters, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(letters) != 2 || !strings.HasPrefix(letters[0], "poison: ") || !strings.Contains(letters[0], "no_poison") ||
				!strings.HasPrefix(letters[1], "boom: ") {
				t.Fatalf("dead letters %q (%v), want the poison's and the boom's", letters, err)
			}
		})
	}
}

// Handlers that queue writes and use the transaction themselves: each
// statement of theirs first reads the results of the writes already sent,
// which otherwise hold the connection ("conn busy"), and every queued write
// still lands once, in order.
func TestQueuedWritesBesideDirectStatements(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	counts := e.table("counts")
	upsert := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ('mixed', $1, 1, $2)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1, last_version = $2,
			bad = c.bad + CASE WHEN c.last_version = $2 - 1 THEN 0 ELSE 1 END`
	var direct atomic.Int64
	p := projection.NewAsync("mixed", projection.AsyncConfig{BatchSize: 500, MaxAttempts: 1})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if err := projection.Queue(ctx, upsert, ev.Stream.ID, ev.Version); err != nil {
			return err
		}
		switch ev.Version % 7 {
		case 3:
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+counts).Scan(&n); err != nil {
				return err
			}
		case 5:
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
		case 6:
			if err := tx.Conn().PgConn().Exec(ctx, `SELECT 1`).Close(); err != nil {
				return err
			}
		default:
			return nil
		}
		direct.Add(1)
		return nil
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := e.appendMany(2, 1500, 30)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("mixed", versions)
	if direct.Load() == 0 {
		t.Fatal("no handler used the transaction itself")
	}
}

// Statements of many distinct texts (SQL built per event): past the
// statements the stream prepares on one connection, the rest go out at the
// end of the batch, after the streamed ones, so every stream's writes still
// land in order.
func TestQueuedWritesOfManyTexts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	counts := e.table("counts")
	p := projection.NewAsync("texts", projection.AsyncConfig{BatchSize: 500, MaxAttempts: 1})
	h := func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
		return projection.Queue(ctx, `INSERT INTO `+counts+` AS c (consumer, stream_id, n, last_version) VALUES ('texts', $1, 1, $2)
			ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1, last_version = $2,
				bad = c.bad + CASE WHEN c.last_version = $2 - 1 THEN 0 ELSE 1 END -- `+ev.ID.String(), ev.Stream.ID, ev.Version)
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := e.appendMany(2, 1200, 10)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("texts", versions)
}

// Each way a streamed statement can fail is pinned on the event that
// queued it, wherever it sits in the batch: text PostgreSQL cannot prepare,
// an argument pgx cannot encode, a constraint refusing the row. Statements
// that return rows are read through. In continuous mode exactly those
// events are dead-lettered and every other one applied once.
func TestQueuedWritesBlameTheirEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	counts := e.table("counts")
	e.exec(`ALTER TABLE ` + counts + ` ADD CONSTRAINT no_poison CHECK (stream_id <> 'poison')`)
	upsert := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ('blame', $1, 1, 1)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1`
	p := projection.NewAsync("blame", projection.AsyncConfig{BatchSize: 500, MaxAttempts: 1, ErrorMode: projection.SkipApplyErrors})
	must(projection.OnEvent(p, e.types.Opened, func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
		switch ev.Stream.ID {
		case "syntax":
			return projection.Queue(ctx, `INSERT INTO `+counts+` garbage`, ev.Stream.ID)
		case "badarg":
			return projection.Queue(ctx, upsert, make(chan int))
		case "returning":
			return projection.Queue(ctx, upsert+` RETURNING n, stream_id`, ev.Stream.ID)
		}
		return projection.Queue(ctx, upsert, ev.Stream.ID)
	}))
	special := map[int]string{10: "syntax", 90: "badarg", 150: "returning", 199: "poison"}
	var ids []string
	for i := range 260 {
		id := fmt.Sprintf("q-%03d", i)
		if s, ok := special[i]; ok {
			id = s
		}
		ids = append(ids, id)
	}
	e.appendStreams(ids)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := e.counts("blame")
	for _, id := range ids {
		want := int64(1)
		if id == "syntax" || id == "badarg" || id == "poison" {
			want = 0
		}
		if got[id] != want {
			t.Fatalf("stream %s applied %d times, want %d", id, got[id], want)
		}
	}
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id || ': ' || error FROM `+e.store.Table("projector_dead_letters")+` ORDER BY event_seq`)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"syntax: ", "badarg: ", "poison: "}
	if len(letters) != len(want) {
		t.Fatalf("dead letters %q, want the syntax error's, the bad argument's and the poison's", letters)
	}
	for i, w := range want {
		if !strings.HasPrefix(letters[i], w) {
			t.Fatalf("dead letters %q, want the syntax error's, the bad argument's and the poison's", letters)
		}
	}
}

// A connection configured without pgx's statement cache (here the exec
// mode that describes every statement, as for a pooler) gets its queued
// writes as one pgx.Batch at the end of the batch, as pgx would send them.
func TestQueuedWritesWithoutStatementCache(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := pgtest.PoolConfig(t)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	store := e.storeOn(pgtest.PoolFromConfig(t, cfg))
	counts := e.table("counts")
	upsert := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ('uncached', $1, 1, $2)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1, last_version = $2,
			bad = c.bad + CASE WHEN c.last_version = $2 - 1 THEN 0 ELSE 1 END`
	p := projection.NewAsync("uncached", projection.AsyncConfig{BatchSize: 500, MaxAttempts: 1})
	h := func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
		return projection.Queue(ctx, upsert, ev.Stream.ID, ev.Version)
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	d := e.dispatcher(projection.Config{Store: store, Projections: []*projection.Async{p}})
	versions := e.appendMany(2, 800, 20)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("uncached", versions)
}
