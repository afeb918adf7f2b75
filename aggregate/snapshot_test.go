package aggregate_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// snapshotRow is one stored snapshot.
type snapshotRow struct {
	aggregate string
	shape     int
	version   int64
	state     []byte
}

func snapshotRows(t testing.TB, f fixture, s projector.StreamRef) []snapshotRow {
	t.Helper()
	rows, err := f.store.Pool().Query(f.ctx, `SELECT aggregate, snapshot_version, version, state FROM `+f.store.Table("projector_snapshots")+`
		WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 ORDER BY aggregate, snapshot_version, version`, s.Tenant, s.Type, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var out []snapshotRow
	var r snapshotRow
	if _, err := pgx.ForEachRow(rows, []any{&r.aggregate, &r.shape, &r.version, &r.state}, func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// doubledComments are the folds of a later shape of the ticket aggregate:
// comments count twice. Loading it from a first-shape snapshot would show.
func doubledComments(types testevents.Types) []aggregate.Fold[Ticket] {
	folds := ticketFolds(types)
	folds[1] = aggregate.On(types.Commented, func(t *Ticket, e testevents.TicketCommented) {
		t.commented(e)
		t.Comments++
	})
	return folds
}

func modelDoubled(events []projector.Event) Ticket {
	t := model(events)
	t.Comments *= 2
	return t
}

// Loading with snapshots equals loading without them, for random streams,
// snapshot intervals and retention, written by a mix of writers that
// snapshot, plain appends that do not, and writers that roll back; every
// stored snapshot equals the fold of the events up to its version; after
// the aggregate's shape changes, old snapshots are ignored, never decoded.
func TestSnapshotsDoNotChangeLoads(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rng := newRand(t)
	type stream struct {
		ref  projector.StreamRef
		repo *aggregate.Repository[Ticket]
	}
	var streams []stream
	fromSnapshot := 0

	// checkLoads compares every kind of load of r on s with fold.
	checkLoads := func(r *aggregate.Repository[Ticket], s projector.StreamRef, fold func([]projector.Event) Ticket) {
		t.Helper()
		events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		n := len(events)
		for k := 1; k <= n; k++ {
			got, err := r.LoadVersion(f.ctx, s, int64(k))
			if err != nil || got.Version != int64(k) || got.State != fold(events[:k]) {
				t.Fatalf("%s version %d: %+v, %v; want %+v", s, k, got, err, fold(events[:k]))
			}
			if got.FromSnapshot > 0 {
				fromSnapshot++
			}
			got, err = r.LoadAsOf(f.ctx, s, events[k-1].RecordedAt)
			j := k
			for j < n && !events[j].RecordedAt.After(events[k-1].RecordedAt) {
				j++
			}
			if err != nil || got.Version != int64(j) || got.State != fold(events[:j]) {
				t.Fatalf("%s as of event %d's time: %+v, %v; want version %d %+v", s, k, got, err, j, fold(events[:j]))
			}
		}
		got, err := r.Load(f.ctx, s)
		if err != nil || got.Version != int64(n) || got.State != fold(events) {
			t.Fatalf("%s current: %+v, %v; want %+v", s, got, err, fold(events))
		}
	}

	for i := range 8 {
		snaps := aggregate.Snapshots{Every: 1 + rng.Int64N(8), Keep: []int{0, 1, 2, 4}[rng.IntN(4)]}
		repo := f.repo(t, snaps)
		s := projector.Stream("ticket", fmt.Sprintf("snap-%d", i))
		n := 5 + rng.IntN(35)
		for version := 0; version < n; {
			chunk := min(1+rng.IntN(5), n-version)
			payloads := randomPayloads(rng, version == 0, chunk)
			switch mode := rng.IntN(10); {
			case mode < 2: // a plain append: no snapshot
				f.appendTx(t, s, projector.ExactVersion(int64(version)), payloads...)
			case mode == 2: // a writer that rolls back takes its snapshot with it
				tx := f.begin(t)
				w, err := repo.FetchForWriting(f.ctx, tx, s)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := w.Append(f.ctx, payloads...); err != nil {
					t.Fatal(err)
				}
				_ = tx.Rollback(f.ctx)
				continue
			default:
				writeTx(t, f, repo, s, payloads...)
			}
			version += chunk
		}
		t.Logf("%s: %d events, snapshots %+v", s, n, snaps)
		checkLoads(repo, s, model)

		events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		rows := snapshotRows(t, f, s)
		if snaps.Keep > 0 && len(rows) > snaps.Keep {
			t.Fatalf("%s: %d snapshots kept, want at most %d", s, len(rows), snaps.Keep)
		}
		for _, row := range rows {
			var state Ticket
			if err := json.Unmarshal(row.state, &state); err != nil {
				t.Fatal(err)
			}
			if want := model(events[:row.version]); state != want {
				t.Fatalf("%s: snapshot at version %d holds %+v, the fold of its events is %+v", s, row.version, state, want)
			}
		}
		streams = append(streams, stream{s, repo})
	}
	if fromSnapshot == 0 {
		t.Fatal("no load started from a snapshot: the test proves nothing")
	}

	// The aggregate's shape changes: comments now count twice. Its loads
	// must ignore every first-shape snapshot until it has written its own,
	// and the first shape's loads must ignore the new ones.
	v2, err := aggregate.New(f.store, aggregate.Config[Ticket]{Name: "ticket", Folds: doubledComments(f.types), Snapshots: aggregate.Snapshots{Every: 3, Version: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range streams {
		got, err := v2.Load(f.ctx, st.ref)
		if err != nil {
			t.Fatal(err)
		}
		if got.FromSnapshot != 0 {
			t.Fatalf("%s: the second shape loaded from a first-shape snapshot at version %d", st.ref, got.FromSnapshot)
		}
		checkLoads(v2, st.ref, modelDoubled)
		before := fromSnapshot
		for range 4 {
			writeTx(t, f, v2, st.ref, testevents.TicketCommented{Body: "v2", N: 7})
		}
		checkLoads(v2, st.ref, modelDoubled)
		if fromSnapshot == before {
			t.Fatalf("%s: the second shape never loaded from its own snapshots", st.ref)
		}
		checkLoads(st.repo, st.ref, model)
	}
}

// Gauge is a state that cannot always be encoded: JSON has no NaN.
type Gauge struct{ Level float64 }

// A snapshot that cannot be written never breaks the append it follows:
// not when the insert fails (here a constraint refuses every row), not when
// the state does not encode; and a snapshot that cannot be decoded is
// ignored, not trusted.
func TestSnapshotFailuresNeverBreakAppends(t *testing.T) {
	t.Parallel()
	f := setup(t)
	table := f.store.Table("projector_snapshots")
	var logged pgtest.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	tickets, err := aggregate.New(f.store, aggregate.Config[Ticket]{Name: "ticket", Folds: ticketFolds(f.types), Snapshots: aggregate.Snapshots{Every: 1}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	wantLogged := func(t *testing.T, msg string) {
		t.Helper()
		if !strings.Contains(logged.String(), msg) {
			t.Errorf("no warning %q logged; log:\n%s", msg, logged.String())
		}
	}

	t.Run("undecodable snapshot is ignored", func(t *testing.T) {
		s := projector.Stream("ticket", "corrupt")
		writeTx(t, f, tickets, s, testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "a"})
		writeTx(t, f, tickets, s, testevents.TicketCommented{Body: "b"})
		if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+table+` SET state = '"not a ticket"' WHERE stream_id = $1`, s.ID); err != nil {
			t.Fatal(err)
		}
		events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tickets.Load(f.ctx, s)
		if err != nil || got.FromSnapshot != 0 || got.State != model(events) {
			t.Fatalf("load over a corrupt snapshot: %+v, %v; want %+v folded from the events", got, err, model(events))
		}
		wantLogged(t, "ignoring a snapshot that does not decode")
	})

	t.Run("insert refused", func(t *testing.T) {
		if _, err := f.store.Pool().Exec(f.ctx, `ALTER TABLE `+table+` ADD CONSTRAINT refuse_all CHECK (false) NOT VALID`); err != nil {
			t.Fatal(err)
		}
		s := projector.Stream("ticket", "refused")
		err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			w, err := tickets.FetchForWriting(f.ctx, tx, s)
			if err != nil {
				return err
			}
			for _, p := range []any{testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "y"}} {
				if _, err := w.Append(f.ctx, p); err != nil {
					return err
				}
			}
			// The transaction is healthy after the failed snapshot writes.
			_, err = tx.Exec(f.ctx, `SELECT 1`)
			return err
		})
		if err != nil {
			t.Fatalf("appends with a failing snapshot write: %v", err)
		}
		got, err := tickets.Load(f.ctx, s)
		if err != nil || got.Version != 2 || got.State.Comments != 1 {
			t.Fatalf("load: %+v, %v", got, err)
		}
		if rows := snapshotRows(t, f, s); len(rows) != 0 {
			t.Fatalf("%d snapshots written past a constraint that refuses all", len(rows))
		}
		wantLogged(t, "snapshot write failed and was rolled back to its savepoint")
		if _, err := f.store.Pool().Exec(f.ctx, `ALTER TABLE `+table+` DROP CONSTRAINT refuse_all`); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("state does not encode", func(t *testing.T) {
		gauges, err := aggregate.New(f.store, aggregate.Config[Gauge]{
			Name:      "gauge",
			Folds:     []aggregate.Fold[Gauge]{aggregate.On(f.types.Commented, func(g *Gauge, _ testevents.TicketCommented) { g.Level = math.NaN() })},
			Snapshots: aggregate.Snapshots{Every: 1},
			Logger:    logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		s := projector.Stream("gauge", "nan")
		writeTx(t, f, gauges, s, testevents.TicketCommented{Body: "nan"})
		got, err := gauges.Load(f.ctx, s)
		if err != nil || got.Version != 1 || !math.IsNaN(got.State.Level) {
			t.Fatalf("load: %+v, %v", got, err)
		}
		if rows := snapshotRows(t, f, s); len(rows) != 0 {
			t.Fatalf("%d snapshots of an unencodable state", len(rows))
		}
		wantLogged(t, "state does not encode as JSON")
	})
}

// TicketStats is a second aggregate over ticket streams.
type TicketStats struct {
	Events   int `json:"events"`
	Comments int `json:"comments"`
}

// Two aggregate types over one stream keep separate snapshots and never read
// each other's.
func TestTwoAggregatesOverOneStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{Every: 2})
	stats, err := aggregate.New(f.store, aggregate.Config[TicketStats]{
		Name: "ticket_stats",
		Folds: []aggregate.Fold[TicketStats]{
			aggregate.On(f.types.Opened, func(s *TicketStats, _ testevents.TicketOpened) { s.Events++ }),
			aggregate.On(f.types.Commented, func(s *TicketStats, _ testevents.TicketCommented) { s.Events++; s.Comments++ }),
		},
		Snapshots: aggregate.Snapshots{Every: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := projector.Stream("ticket", "shared")
	writeTx(t, f, tickets, s, testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "1"})
	writeTx(t, f, stats, s, testevents.TicketCommented{Body: "2"}, testevents.TicketCommented{Body: "3"}, testevents.TicketCommented{Body: "4"})
	writeTx(t, f, tickets, s, testevents.TicketCommented{Body: "5"}, testevents.TicketClosed{})

	byName := map[string][]int64{}
	for _, row := range snapshotRows(t, f, s) {
		byName[row.aggregate] = append(byName[row.aggregate], row.version)
	}
	if fmt.Sprint(byName) != "map[ticket:[2 7] ticket_stats:[5]]" {
		t.Fatalf("snapshots by aggregate: %v", byName)
	}
	tk, err := tickets.Load(f.ctx, s)
	if err != nil || tk.FromSnapshot != 7 || tk.State.Comments != 5 || tk.State.Open {
		t.Fatalf("ticket: %+v, %v", tk, err)
	}
	st, err := stats.Load(f.ctx, s)
	if err != nil || st.FromSnapshot != 5 || st.Version != 7 || st.State != (TicketStats{Events: 6, Comments: 5}) {
		t.Fatalf("stats: %+v, %v", st, err)
	}
}
