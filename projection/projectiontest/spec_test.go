package projectiontest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/projection/projectiontest"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Renamed is ticket.renamed at schema version 2; version 1 called the
// field "name".
type Renamed struct {
	Title string `json:"title"`
}

// kit is a store with the test projections' tables, and the projections.
type kit struct {
	store   *postgres.Store
	ty      testevents.Types
	tickets string // table of the async and inline projections
	counts  string // table of the batch projection
	async   *projection.Async
	inline  *projection.Inline
	batch   *projection.Async
}

// setup makes a store on a schema of its own and three projections of the
// same tickets: async (typed handlers, Queue, a direct write, Replaying
// recorded), inline, and a batch handler counting events per stream.
func setup(t testing.TB) *kit {
	t.Helper()
	ty := testevents.New()
	renamed := projector.MustDefine[Renamed](ty.Registry, "ticket.renamed", projector.TypeConfig{SchemaVersion: 2,
		Upcasters: []projector.Upcaster{{From: 1, Func: func(old json.RawMessage) (json.RawMessage, error) {
			var v1 struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(old, &v1); err != nil {
				return nil, err
			}
			return json.Marshal(Renamed{Title: v1.Name})
		}}}})
	store := pgtest.Store(t, ty.Registry)
	k := &kit{store: store, ty: ty,
		tickets: pgx.Identifier{store.Schema(), "tickets"}.Sanitize(),
		counts:  pgx.Identifier{store.Schema(), "event_counts"}.Sanitize()}
	if _, err := store.Pool().Exec(context.Background(), `
		CREATE TABLE `+k.tickets+` (tenant text, id text, title text NOT NULL, comments int NOT NULL DEFAULT 0,
			status text NOT NULL, replaying bool NOT NULL, opened_at timestamptz NOT NULL, PRIMARY KEY (tenant, id));
		CREATE TABLE `+k.counts+` (tenant text, stream text, events bigint NOT NULL, PRIMARY KEY (tenant, stream))`); err != nil {
		t.Fatal(err)
	}
	k.async = projection.NewAsync("tickets", projection.AsyncConfig{})
	k.inline = projection.NewInline("tickets_inline")
	for _, p := range []projection.Projection{k.async, k.inline} {
		queue := p == projection.Projection(k.async)
		must(t, projection.On(p, ty.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketOpened) error {
			return write(ctx, tx, queue, `INSERT INTO `+k.tickets+` (tenant, id, title, status, replaying, opened_at) VALUES ($1, $2, $3, 'open', $4, $5)`,
				ev.Stream.Tenant, ev.Stream.ID, e.Title, projection.Replaying(ctx), ev.RecordedAt)
		}))
		must(t, projection.On(p, ty.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketCommented) error {
			if e.Body == "boom" {
				return errors.New("comment refused: boom")
			}
			return write(ctx, tx, queue, `UPDATE `+k.tickets+` SET comments = comments + 1 WHERE tenant = $1 AND id = $2`, ev.Stream.Tenant, ev.Stream.ID)
		}))
		must(t, projection.On(p, ty.Closed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ testevents.TicketClosed) error {
			return write(ctx, tx, queue, `UPDATE `+k.tickets+` SET status = 'closed' WHERE tenant = $1 AND id = $2`, ev.Stream.Tenant, ev.Stream.ID)
		}))
		must(t, projection.On(p, renamed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e Renamed) error {
			return write(ctx, tx, queue, `UPDATE `+k.tickets+` SET title = $3 WHERE tenant = $1 AND id = $2`, ev.Stream.Tenant, ev.Stream.ID, e.Title)
		}))
	}
	k.batch = projection.NewAsync("event_counts", projection.AsyncConfig{})
	must(t, projection.OnBatch(k.batch, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
		tenants, streams, counts := []string{}, []string{}, []int64{}
		for _, s := range b.Streams {
			tenants = append(tenants, current(ctx, tx))
			streams = append(streams, s.Stream.ID)
			counts = append(counts, int64(len(s.Events)))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+k.counts+` AS c (tenant, stream, events)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
			ON CONFLICT (tenant, stream) DO UPDATE SET events = c.events + excluded.events`, tenants, streams, counts)
		return err
	}, ty.Opened, ty.Commented, ty.Closed))
	return k
}

// write queues a write (async: all of a projection's writes must be
// queued, or an update could run before the insert still in the queue) or
// runs it (inline, where Queue does not work).
func write(ctx context.Context, tx pgx.Tx, queue bool, sql string, args ...any) error {
	if queue {
		return projection.Queue(ctx, sql, args...)
	}
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

// current is the tenant the transaction is scoped to, as PostgreSQL sees it.
func current(ctx context.Context, tx pgx.Tx) string {
	var s string
	if err := tx.QueryRow(ctx, `SELECT coalesce(current_setting('`+postgres.TenantSetting+`', true), '')`).Scan(&s); err != nil {
		return "error: " + err.Error()
	}
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestSpec_GivenThenRows(t *testing.T) {
	t.Parallel()
	k := setup(t)
	for _, tc := range []struct {
		name string
		cfg  projectiontest.Config
	}{
		{"async", projectiontest.Config{Store: k.store, Async: k.async, Deterministic: true}},
		{"inline", projectiontest.Config{Store: k.store, Inline: k.inline, Deterministic: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := projectiontest.New(t, tc.cfg)
			a, b := projector.Stream("ticket", tc.name+"-a"), projector.Stream("ticket", tc.name+"-b")
			s.Given(a, testevents.TicketOpened{Title: "Printer"}, testevents.TicketCommented{Body: "jammed"}).
				Given(b, testevents.TicketOpened{Title: "VPN"})
			s.Clock().Advance(90 * 60e9)
			s.When(a, testevents.TicketClosed{}).
				ThenRows(`SELECT id, title, comments, status, replaying, opened_at FROM `+k.tickets+` ORDER BY id`,
					projectiontest.Row{tc.name + "-a", "Printer", 1, "closed", false, "2026-01-01T09:00:00Z"},
					projectiontest.Row{tc.name + "-b", "VPN", 0, "open", false, projectiontest.Start})
		})
	}
}

// ThenRowsArgs passes its arguments to the query: only the row of the
// stream asked for comes back, and the values need no quoting.
func TestSpec_ThenRowsArgs(t *testing.T) {
	t.Parallel()
	k := setup(t)
	s := projectiontest.New(t, projectiontest.Config{Store: k.store, Async: k.async, Deterministic: true})
	s.Given(projector.Stream("ticket", "args-a"), testevents.TicketOpened{Title: "it's jammed"}).
		Given(projector.Stream("ticket", "args-b"), testevents.TicketOpened{Title: "VPN"}).
		ThenRowsArgs(`SELECT id, title FROM `+k.tickets+` WHERE id = $1 OR title = $2 ORDER BY id`,
			[]any{"args-b", "it's jammed"},
			projectiontest.Row{"args-a", "it's jammed"}, projectiontest.Row{"args-b", "VPN"})
}

// The async projection's typed decoding runs the upcasters: a version 1
// payload reaches the handler as the version 2 type.
func TestSpec_Upcasters(t *testing.T) {
	t.Parallel()
	k := setup(t)
	for name, cfg := range map[string]projectiontest.Config{
		"async":  {Store: k.store, Async: k.async},
		"inline": {Store: k.store, Inline: k.inline},
	} {
		s := projectiontest.New(t, cfg)
		st := projector.Stream("ticket", "up-"+name)
		s.Given(st, testevents.TicketOpened{Title: "old"}).
			GivenEvents(projector.Event{Stream: st, Type: "ticket.renamed", SchemaVersion: 1, Data: json.RawMessage(`{"name":"new"}`)}).
			ThenRows(`SELECT title FROM `+k.tickets+` WHERE id = 'up-`+name+`'`, projectiontest.Row{"new"})
	}
}

// Each event's handler runs scoped to its tenant, and a batch handler gets
// one tenant's events at a time; Config.Tenant fixes the tenant of
// streams that name none.
func TestSpec_TenantScoping(t *testing.T) {
	t.Parallel()
	k := setup(t)
	s := projectiontest.New(t, projectiontest.Config{Store: k.store, Async: k.batch, Tenant: "acme"})
	s.Given(projector.Stream("ticket", "1"), testevents.TicketOpened{Title: "x"}, testevents.TicketClosed{}).
		Given(projector.TenantStream("globex", "ticket", "2"), testevents.TicketOpened{Title: "y"}).
		Given(projector.Stream("ticket", "3"), testevents.TicketOpened{Title: "z"}).
		ThenRows(`SELECT tenant, stream, events FROM `+k.counts+` ORDER BY stream`,
			projectiontest.Row{"acme", "1", 2}, projectiontest.Row{"globex", "2", 1}, projectiontest.Row{"acme", "3", 1}).
		Then(func(ctx context.Context, tx pgx.Tx) error {
			if got := current(ctx, tx); got != "" {
				return fmt.Errorf("the spec's transaction is left scoped to %q", got)
			}
			return nil
		})
}

// Cells that differ never match: SQL NULL and the text 'NULL', an array
// and the text it would print as, arrays whose elements differ but whose
// elements printed side by side look alike.
func TestSpec_CellsKeepApartWhatDiffers(t *testing.T) {
	t.Parallel()
	k := setup(t)
	cfg := projectiontest.Config{Store: k.store, Async: k.async}
	var none []string
	for _, tc := range []struct {
		sql  string
		same []any // each matches the cell
		diff []any // none does
	}{
		{`'NULL'::text`, []any{"NULL"}, []any{nil, none, (*string)(nil)}},
		{`NULL::text`, []any{nil, none, (*string)(nil)}, []any{"NULL", "", "<nil>"}},
		{`ARRAY['a b']::text[]`, []any{[]string{"a b"}, []any{"a b"}}, []any{"[a b]", []string{"a", "b"}, "{\"a b\"}"}},
		{`ARRAY['a','b']::text[]`, []any{[]string{"a", "b"}}, []any{[]string{"a b"}, "[a b]", []string{"a, b"}}},
		{`ARRAY['a, b']::text[]`, []any{[]string{"a, b"}}, []any{[]string{"a", "b"}}},
		{`'[a b]'::text`, []any{"[a b]"}, []any{[]string{"a b"}, []string{"a", "b"}}},
		{`'"x"'::text`, []any{`"x"`}, []any{"x"}},
		{`ARRAY[]::text[]`, []any{[]string{}, []int{}}, []any{nil, none, []string{""}, "[]"}},
		{`ARRAY['', NULL]::text[]`, []any{[]any{"", nil}}, []any{[]string{"", "NULL"}, []any{nil, ""}}},
		{`ARRAY[1, 2]::int[]`, []any{[]int{1, 2}, []int64{1, 2}}, []any{[]int{12}, "[1 2]"}},
	} {
		// A subtest each: a spec holds a connection until its test ends.
		for _, want := range tc.same {
			t.Run("", func(t *testing.T) {
				projectiontest.New(t, cfg).ThenRows(`SELECT `+tc.sql, projectiontest.Row{want})
			})
		}
		for _, want := range tc.diff {
			if got := run(t, func(t testing.TB) {
				projectiontest.New(t, cfg).ThenRows(`SELECT `+tc.sql, projectiontest.Row{want})
			}); !strings.Contains(got, "row 1 differs") {
				t.Errorf("SELECT %s matched %#v; want them to differ (%s)", tc.sql, want, got)
			}
		}
	}
}

// A failing handler rolls back its own event only; ThenFails names it.
func TestSpec_ThenFails(t *testing.T) {
	t.Parallel()
	k := setup(t)
	s := projectiontest.New(t, projectiontest.Config{Store: k.store, Async: k.async})
	st := projector.Stream("ticket", "fails")
	s.Given(st, testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "fine"}, testevents.TicketCommented{Body: "boom"}).
		ThenFails("boom").
		ThenRows(`SELECT comments FROM `+k.tickets+` WHERE id = 'fails'`, projectiontest.Row{1})
}

// The events after a failing one are not applied by ThenFails: they stay
// given, and the next check applies them. An inline projection's failing
// append is rolled back whole: the stream's run of events in the batch.
func TestSpec_ThenFailsLeavesTheRestGiven(t *testing.T) {
	t.Parallel()
	k := setup(t)
	for name, tc := range map[string]struct {
		cfg  projectiontest.Config
		want []projectiontest.Row
	}{
		"async":  {projectiontest.Config{Store: k.store, Async: k.async}, []projectiontest.Row{{"af1", 0}, {"af2", 1}}},
		"inline": {projectiontest.Config{Store: k.store, Inline: k.inline}, []projectiontest.Row{{"af2", 1}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, b := projector.Stream("ticket", "af1"), projector.Stream("ticket", "af2")
			projectiontest.New(t, tc.cfg).
				Given(a, testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "boom"}).
				Given(b, testevents.TicketOpened{Title: "y"}).
				ThenFails("boom").
				Given(b, testevents.TicketCommented{Body: "fine"}).
				ThenRows(`SELECT id, comments FROM `+k.tickets+` ORDER BY id`, tc.want...)
		})
	}
}

// Deterministic ids are the same on every run of a spec and differ from
// every other spec's, a second spec of the same test's included; the
// clock starts at Start.
func TestSpec_DeterministicIDs(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	ids := func(t testing.TB, deterministic bool) []string {
		return projectiontest.NewMemory(t, projectiontest.MemoryConfig[[]string]{Registry: ty.Registry, Deterministic: deterministic,
			Fold: func(m []string, ev projector.Event) ([]string, error) {
				return append(m, ev.ID.String()+" at "+ev.RecordedAt.Format(time.RFC3339)), nil
			}}).
			Given(projector.Stream("ticket", "1"), testevents.TicketOpened{Title: "x"}, testevents.TicketClosed{}).Model()
	}
	named := func(name string) testing.TB { return &fakeT{TB: t, name: name} }
	first, again, other, random := ids(named("spec-a"), true), ids(named("spec-a"), true), ids(named("spec-b"), true), ids(named("spec-a"), false)
	if len(first) != 2 || first[0] == first[1] || !strings.HasSuffix(first[0], " at 2026-01-01T09:00:00Z") {
		t.Fatalf("deterministic events = %v, want two ids at %v", first, projectiontest.Start)
	}
	if !slices.Equal(first, again) {
		t.Errorf("two runs of one spec: %v, then %v", first, again)
	}
	if first[0] == other[0] || first[1] == other[1] {
		t.Errorf("two specs share event ids: %v and %v", first, other)
	}
	if random[0] == first[0] || strings.HasSuffix(random[0], " at 2026-01-01T09:00:00Z") {
		t.Errorf("without Deterministic: %v, want random ids at the time the spec started", random)
	}
	// Two specs in one test: the second must not remake the first one's
	// ids (on PostgreSQL it would wait on the first one's uncommitted rows).
	twoSpecs := func() []string {
		one := named("spec-c")
		return append(ids(one, true), ids(one, true)...)
	}
	both := twoSpecs()
	if len(slices.Compact(slices.Sorted(slices.Values(both)))) != 4 {
		t.Errorf("two specs of one test share event ids: %v", both)
	}
	if bothAgain := twoSpecs(); !slices.Equal(both, bothAgain) {
		t.Errorf("two runs of a test of two specs: %v, then %v", both, bothAgain)
	}
}

// fakeT records a spec's failures instead of failing the test: what the
// kit prints is tested like any other output. Fatalf ends the spec's
// goroutine, as testing.T's does.
type fakeT struct {
	testing.TB
	name     string
	mu       sync.Mutex
	messages []string
	cleanups []func()
}

func (f *fakeT) Helper() {}
func (f *fakeT) Name() string {
	if f.name != "" {
		return f.name
	}
	return f.TB.Name()
}
func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.messages = append(f.messages, fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}
func (f *fakeT) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.messages) > 0
}
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// run runs spec with a fakeT, its clean-ups included, and returns what it
// reported.
func run(t testing.TB, spec func(t testing.TB)) string {
	f := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		spec(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return strings.Join(f.messages, "\n---\n")
}

func TestSpec_FailureMessages(t *testing.T) {
	t.Parallel()
	k := setup(t)
	cfg := projectiontest.Config{Store: k.store, Async: k.async, Deterministic: true}
	for _, tc := range []struct {
		name string
		spec func(t testing.TB)
		want []string
	}{
		{"wrong row", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w1"), testevents.TicketOpened{Title: "Printer"}, testevents.TicketClosed{}).
				ThenRows(`SELECT id, status FROM `+k.tickets, projectiontest.Row{"w1", "open"})
		}, []string{
			"row 1 differs: want (w1, open), found (w1, closed)",
			"1. ticket.opened v1 of __system__/ticket/w1 at 2026-01-01T09:00:00Z {\"title\":\"Printer\"}",
			"2. ticket.closed v2 of __system__/ticket/w1",
			"want 1 rows:\n  (w1, open)\nfound 1 rows:\n  (w1, closed)",
		}},
		{"missing row", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w2"), testevents.TicketOpened{Title: "a"}).
				ThenRows(`SELECT id FROM `+k.tickets+` ORDER BY id`, projectiontest.Row{"w2"}, projectiontest.Row{"w3"})
		}, []string{"row 2 missing: want (w3)", "found 1 rows:\n  (w2)"}},
		{"wrong row, query with arguments", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w8"), testevents.TicketOpened{Title: "Printer"}).
				ThenRowsArgs(`SELECT id, title FROM `+k.tickets+` WHERE id = $1`, []any{"w8"}, projectiontest.Row{"w8", "Fax"})
		}, []string{"row 1 differs: want (w8, Fax), found (w8, Printer)"}},
		{"query arguments missing", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w9"), testevents.TicketOpened{Title: "Printer"}).
				ThenRowsArgs(`SELECT id FROM `+k.tickets+` WHERE id = $1 AND title = $2`, []any{"w9"}, projectiontest.Row{"w9"})
		}, []string{"WHERE id = $1 AND title = $2", "expected 2 arguments, got 1", "1. ticket.opened v1 of __system__/ticket/w9"}},
		{"unexpected row", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w4"), testevents.TicketOpened{Title: "a\x1b[2J"}).
				ThenRows(`SELECT title FROM ` + k.tickets)
		}, []string{`row 1 unexpected: found ("a\x1b[2J")`}},
		{"handler error", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w5"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "boom"}).
				ThenRows(`SELECT id FROM ` + k.tickets)
		}, []string{"ticket.commented v2 of __system__/ticket/w5", "comment refused: boom", "events (2):"}},
		{"check func", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w6"), testevents.TicketOpened{Title: "a"}).
				Then(func(context.Context, pgx.Tx) error { return errors.New("no mail sent") })
		}, []string{"check failed: no mail sent", "ticket.opened v1 of __system__/ticket/w6"}},
		{"fails but applied", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w7"), testevents.TicketOpened{Title: "a"}).ThenFails("boom")
		}, []string{`the events applied, want a failure containing "boom"`}},
		{"events after the failing one", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w10"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "boom"}).
				Given(projector.Stream("ticket", "w11"), testevents.TicketOpened{Title: "b"}).
				ThenRows(`SELECT id FROM ` + k.tickets)
		}, []string{
			"events (2):\n  1. ticket.opened v1 of __system__/ticket/w10",
			"2. ticket.commented v2 of __system__/ticket/w10 at 2026-01-01T09:00:00Z {\"body\":\"boom\"} (failed, rolled back)\n" +
				"given, not applied (1):\n  3. ticket.opened v1 of __system__/ticket/w11",
		}},
		{"wrong row after ThenFails", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w12"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "boom"}).
				ThenFails("boom").
				ThenRows(`SELECT id FROM `+k.tickets, projectiontest.Row{"w13"})
		}, []string{"events (2):", "(failed, rolled back)"}},
		{"events never applied", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w14"), testevents.TicketOpened{Title: "a"}).
				When(projector.Stream("ticket", "w14"), testevents.TicketCommented{Body: "boom"})
		}, []string{
			"the spec ended with 1 event(s) given and never applied",
			"events (1):\n  1. ticket.opened v1 of __system__/ticket/w14",
			"given, not applied (1):\n  2. ticket.commented v2 of __system__/ticket/w14",
		}},
		{"events after ThenFails never applied", func(t testing.TB) {
			projectiontest.New(t, cfg).Given(projector.Stream("ticket", "w15"), testevents.TicketCommented{Body: "boom"}, testevents.TicketOpened{Title: "a"}).
				ThenFails("boom")
		}, []string{"1 event(s) given and never applied", "given, not applied (1):\n  2. ticket.opened v2 of __system__/ticket/w15"}},
		{"memory events never folded", func(t testing.TB) {
			projectiontest.NewMemory(t, projectiontest.MemoryConfig[int]{Registry: k.ty.Registry,
				Fold: func(n int, _ projector.Event) (int, error) { return n + 1, nil }}).
				Given(projector.Stream("ticket", "m"), testevents.TicketOpened{Title: "a"}).ThenModel(1).
				Given(projector.Stream("ticket", "m"), testevents.TicketClosed{})
		}, []string{"1 event(s) given and never applied", "(Model, ThenModel, Then, ThenFails)", "2. ticket.closed v2 of __system__/ticket/m"}},
		{"memory model", func(t testing.TB) {
			projectiontest.NewMemory(t, projectiontest.MemoryConfig[int]{Registry: k.ty.Registry, Deterministic: true,
				Fold: func(n int, _ projector.Event) (int, error) { return n + 1, nil }}).
				Given(projector.Stream("ticket", "m"), testevents.TicketOpened{Title: "a"}).ThenModel(2)
		}, []string{"model differs", "want 2\nfound 1", "1. ticket.opened v1 of __system__/ticket/m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, tc.spec)
			if got == "" {
				t.Fatal("the spec passed; want it to fail")
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("failure message lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
