package rebuild_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// titler keeps one row per ticket in a table with a composite primary key
// and a json column (a type without an equality operator). Version 1
// ignores tickets named new-*; version 2 ignores gone-*, upper-cases the
// titles of chg-* and writes other metadata for js-*.
func titler(e *env, version int) *projection.Async {
	table := e.schema + ".titles"
	p := projection.NewAsync("titler", projection.AsyncConfig{Version: version, Tables: []string{table}})
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		id := ev.Stream.ID
		title, meta := o.Title, `{"v": 1}`
		switch {
		case version == 1 && strings.HasPrefix(id, "new-"), version == 2 && strings.HasPrefix(id, "gone-"):
			return nil
		case version == 2 && strings.HasPrefix(id, "chg-"):
			title = strings.ToUpper(title)
		case version == 2 && strings.HasPrefix(id, "js-"):
			meta = `{"v": 2}`
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, table)+` (stream_type, stream_id, n, title, meta) VALUES ($1, $2, 1, $3, $4)`,
			ev.Stream.Type, id, title, meta)
		return err
	}))
	must(projection.OnEvent(p, e.types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `UPDATE `+projection.Table(ctx, table)+` SET n = n + 1 WHERE stream_type = $1 AND stream_id = $2`, ev.Stream.Type, ev.Stream.ID)
		return err
	}))
	return p
}

func (e *env) ticket(id string) {
	e.t.Helper()
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream,
			testevents.TicketOpened{Title: "t " + id}, testevents.TicketCommented{Body: "c"})
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

// waitReady waits for the projection's rebuild to be held at ready.
func (e *env) waitReady(name string) rebuild.Rebuild {
	e.t.Helper()
	var rb rebuild.Rebuild
	eventually(e.t, time.Minute, name+"'s rebuild to be ready", func() bool {
		var err error
		rb, err = rebuild.Current(e.ctx, e.store, name)
		return err == nil && rb.Status == rebuild.Ready
	})
	return rb
}

// Diff shows what a switch to a new version would change: the row counts,
// every missing, extra and changed row counted, the first ones by primary
// key with the columns that differ (a json column included), and nothing
// else; the switch then does what the diff showed.
func TestDiffShowsWhatTheSwitchChanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "titles"}.Sanitize() + ` (stream_type text, stream_id text, n int NOT NULL,
		title text NOT NULL, meta json NOT NULL, PRIMARY KEY (stream_type, stream_id))`)
	for _, id := range []string{"same-0", "chg-1", "gone-0", "js-0", "chg-0", "new-0", "same-1", "chg-2", "gone-1", "same-2"} {
		e.ticket(id)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := e.dispatcher(titler(e, 1)).CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.dispatcher(titler(e, 2))
	if _, err := rebuild.Request(e.ctx, e.store, "titler", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	rb := e.waitReady("titler")

	d, err := rebuild.Diff(e.ctx, e.store, "titler", 100)
	if err != nil {
		t.Fatal(err)
	}
	if d.Rebuild.ID != rb.ID || d.EventsBetween != 0 || len(d.Tables) != 1 || d.Same() {
		t.Fatalf("diff of rebuild %d: %+v", rb.ID, d)
	}
	td := d.Tables[0]
	if td.Table != e.schema+".titles" || td.Shadow != rb.ShadowSchema+".titles" || !slices.Equal(td.Key, []string{"stream_type", "stream_id"}) {
		t.Fatalf("compared %s with %s by %v", td.Table, td.Shadow, td.Key)
	}
	if td.LiveRows != 9 || td.ShadowRows != 8 || td.Missing != 2 || td.Extra != 1 || td.Changed != 4 {
		t.Fatalf("counts: live %d shadow %d, missing %d extra %d changed %d; want 9 8, 2 1 4", td.LiveRows, td.ShadowRows, td.Missing, td.Extra, td.Changed)
	}
	type row struct {
		kind    rebuild.RowKind
		id      string
		columns string
	}
	want := []row{
		{rebuild.Changed, "chg-0", "title"}, {rebuild.Changed, "chg-1", "title"}, {rebuild.Changed, "chg-2", "title"},
		{rebuild.Missing, "gone-0", ""}, {rebuild.Missing, "gone-1", ""}, {rebuild.Changed, "js-0", "meta"}, {rebuild.Extra, "new-0", ""},
	}
	var got []row
	for _, r := range td.Rows {
		if len(r.Key) != 2 || r.Key[0] != "ticket" {
			t.Fatalf("row key %v", r.Key)
		}
		got = append(got, row{r.Kind, fmt.Sprint(r.Key[1]), strings.Join(r.Columns, ",")})
		if (r.Live == nil) != (r.Kind == rebuild.Extra) || (r.Shadow == nil) != (r.Kind == rebuild.Missing) {
			t.Errorf("%s row %v: live %v, shadow %v", r.Kind, r.Key, r.Live, r.Shadow)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("differing rows:\n got %v\nwant %v", got, want)
	}
	if r := td.Rows[0]; r.Live["title"] != "t chg-0" || r.Shadow["title"] != "T CHG-0" || r.Live["n"] != json.Number("2") {
		t.Fatalf("chg-0: live %v, shadow %v", r.Live, r.Shadow)
	}

	// The limit cuts the rows shown, not the counts.
	d2, err := rebuild.Diff(e.ctx, e.store, "titler", 2)
	if err != nil {
		t.Fatal(err)
	}
	if td2 := d2.Tables[0]; len(td2.Rows) != 2 || fmt.Sprint(td2.Rows[1].Key) != "[ticket chg-1]" || td2.Missing != 2 || td2.Changed != 4 {
		t.Fatalf("limit 2: %+v", td2)
	}

	// What the diff showed is what readers get after the switch.
	if err := rebuild.Switch(e.ctx, e.store, "titler"); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "titler", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("switch: %+v, %v", final, err)
	}
	var n int
	var ids []string
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id FROM `+pgx.Identifier{e.schema, "titles"}.Sanitize()+` WHERE title = upper(title) OR stream_id LIKE 'new-%' ORDER BY 1`)
	if err == nil {
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err == nil {
		err = e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+pgx.Identifier{e.schema, "titles"}.Sanitize()).Scan(&n)
	}
	if err != nil || n != 8 || !slices.Equal(ids, []string{"chg-0", "chg-1", "chg-2", "new-0"}) {
		t.Fatalf("after the switch: %d rows, changed/new %v, %v", n, ids, err)
	}
	if _, err := rebuild.Diff(e.ctx, e.store, "titler", 0); !errors.Is(err, rebuild.ErrNotActive) {
		t.Fatalf("diff after the switch: %v, want ErrNotActive", err)
	}
}

// A diff while events keep arriving compares both models at one position
// where it can: a rebuild of the same handlers then shows no difference.
// Where it cannot, it says how many events lie between the two models, and
// every row it shows belongs to a stream with events there; once the writers
// stop, the diff is exact and empty.
func TestDiffWhileWritersAppend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	stop := make(chan struct{})
	writers := e.write(4, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		writers.Wait()
	}()
	eventually(t, time.Minute, "the live model to count something", func() bool {
		r, err := e.read()
		return err == nil && r.counted > 0
	})
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	e.waitReady("counter")
	exact := 0
	for range 5 {
		d, err := rebuild.Diff(e.ctx, e.store, "counter", rebuild.MaxDiffLimit)
		if err != nil {
			t.Fatal(err)
		}
		if d.EventsBetween == 0 {
			exact++
			if !d.Same() {
				t.Fatalf("an exact diff of identical handlers differs: %+v", d.Tables)
			}
			continue
		}
		lo, hi := d.LiveCursor, d.ShadowCursor
		if hi.Less(lo) {
			lo, hi = hi, lo
		}
		rows, err := e.store.Pool().Query(e.ctx, `SELECT DISTINCT stream_id FROM `+e.store.Table("projector_events")+`
			WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND (tx_id, seq) <= ($3::xid8, $4::bigint)`, lo.TxID, lo.Seq, hi.TxID, hi.Seq)
		if err != nil {
			t.Fatal(err)
		}
		moved, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range d.Tables[0].Rows {
			if !slices.Contains(moved, fmt.Sprint(r.Key[0])) {
				t.Fatalf("diff between %s and %s shows %s row %v, whose stream has no event between them", d.LiveCursor, d.ShadowCursor, r.Kind, r.Key)
			}
		}
	}
	close(stop)
	writers.Wait()
	var streams int64
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(DISTINCT stream_id) FROM `+e.store.Table("projector_events")).Scan(&streams); err != nil {
		t.Fatal(err)
	}
	var d rebuild.Difference
	eventually(t, time.Minute, "an exact diff of the whole log once the writers stopped", func() bool {
		var err error
		d, err = rebuild.Diff(e.ctx, e.store, "counter", 10)
		if err != nil {
			t.Fatal(err)
		}
		return d.EventsBetween == 0 && d.Tables[0].LiveRows == streams
	})
	if !d.Same() || d.Tables[0].LiveRows == 0 || d.Tables[0].LiveRows != d.Tables[0].ShadowRows {
		t.Fatalf("quiet diff of identical handlers: %+v", d.Tables)
	}
	t.Logf("%d of 5 diffs under load were exact; quiet diff compared %d rows", exact, d.Tables[0].LiveRows)

	// A shadow that cannot keep up (its shard disabled) and a live model
	// that moves on: the diff says how far apart they are and shows only
	// the rows the events in between touched.
	admin := projection.NewAdmin(e.store)
	if err := admin.Disable(e.ctx, projection.ShardID{Consumer: "counter", Instance: projection.RebuildInstance}); err != nil {
		t.Fatal(err)
	}
	e.ticket("late")
	eventually(t, time.Minute, "the live model to count the late ticket", func() bool {
		var n int
		err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` WHERE stream_id = 'late'`).Scan(&n)
		return err == nil && n == 1
	})
	d, err := rebuild.Diff(e.ctx, e.store, "counter", 10)
	if err != nil {
		t.Fatal(err)
	}
	if td := d.Tables[0]; d.EventsBetween != 2 || !d.ShadowCursor.Less(d.LiveCursor) || td.Missing != 1 || td.Changed != 0 || td.Extra != 0 ||
		len(td.Rows) != 1 || fmt.Sprint(td.Rows[0].Key) != "[late]" {
		t.Fatalf("diff with the shadow behind: %d events between %s and %s, %+v", d.EventsBetween, d.ShadowCursor, d.LiveCursor, td)
	}
}

// Diff refuses what it cannot compare, saying why.
func TestDiffRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "nopk"}.Sanitize() + ` (stream_id text NOT NULL)`)
	nopk := projection.NewAsync("nopk", projection.AsyncConfig{Tables: []string{e.schema + ".nopk"}})
	must(projection.OnEvent(nopk, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.schema+".nopk")+` VALUES ($1)`, ev.Stream.ID)
		return err
	}))
	e.ticket("a")
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	d1 := e.dispatcher(e.counter(1, projection.AsyncConfig{}), nopk)
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}

	for _, limit := range []int{-1, rebuild.MaxDiffLimit + 1} {
		if _, err := rebuild.Diff(e.ctx, e.store, "counter", limit); !errors.Is(err, rebuild.ErrDiffLimit) {
			t.Errorf("limit %d: %v, want ErrDiffLimit", limit, err)
		}
	}
	if _, err := rebuild.Diff(e.ctx, e.store, "Bad Name", 0); !errors.Is(err, rebuild.ErrUnknownProjection) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := rebuild.Diff(e.ctx, e.store, "counter", 0); !errors.Is(err, rebuild.ErrNotActive) {
		t.Errorf("no rebuild: %v, want ErrNotActive", err)
	}

	if _, err := rebuild.Request(e.ctx, e.store, "nopk", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	e.waitReady("nopk")
	if _, err := rebuild.Diff(e.ctx, e.store, "nopk", 0); !errors.Is(err, rebuild.ErrNoPrimaryKey) {
		t.Errorf("table without a primary key: %v, want ErrNoPrimaryKey", err)
	}
	if err := rebuild.Cancel(e.ctx, e.store, "nopk"); err != nil {
		t.Fatal(err)
	}

	// Without a dispatcher, a rebuild stays building.
	if err := d1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []rebuild.Options{{Hold: true}, {}} {
		if _, err := rebuild.Request(e.ctx, e.store, "counter", opts); err != nil {
			t.Fatal(err)
		}
		_, err := rebuild.Diff(e.ctx, e.store, "counter", 0)
		if !errors.Is(err, rebuild.ErrNotReady) || !strings.Contains(err.Error(), "building") {
			t.Errorf("building, hold %v: %v, want ErrNotReady", opts.Hold, err)
		}
		if err := rebuild.Cancel(e.ctx, e.store, "counter"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Diff(e.ctx, e.store, "counter", 0); !errors.Is(err, rebuild.ErrNotRebuildable) {
		t.Errorf("in place: %v, want ErrNotRebuildable", err)
	}
}
