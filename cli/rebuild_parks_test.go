package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// parkingCounter is the counter in ParkStream mode (one attempt) whose
// version 2 cannot handle the opening of tickets t01 and t02.
func (e *rebuildEnv) parkingCounter(version int) *projection.Async {
	cfg := projection.AsyncConfig{Version: version, ErrorMode: projection.ParkStream, MaxAttempts: 1}
	return e.counterWith(cfg, func(ev projector.Event) error {
		if version == 2 && ev.Type == e.types.Opened.Name() && (ev.Stream.ID == "t01" || ev.Stream.ID == "t02") {
			return errors.New("version 2 cannot open this ticket")
		}
		return nil
	})
}

// openParks returns the open parks of the counter.
func (e *rebuildEnv) openParks() []projection.Park {
	e.t.Helper()
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "counter", Status: projection.ParkOpen})
	if err != nil {
		e.t.Fatal(err)
	}
	return parks
}

// `rebuild --wait` of a ParkStream projection whose new version parks
// streams says how many, and where to see them, after "switched" (and
// after "done" in place), and still exits 0; `--diff` says so of the
// shadow before the switch; an in-place rebuild names the parks it kept
// apart from those its replay made. It said "switched" alone, and the
// operator learnt of the parked streams later from `status`, if at all.
func TestRebuildWaitReportsParkedStreams(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 6)
	e.dispatcher(e.parkingCounter(1))
	e.dispatcher(e.parkingCounter(2))

	e.run(nil, "rebuild", "counter", "--wait").want(t, ExitOK, "switched: version 2 is live",
		"2 streams parked by the rebuild: see `projector parked list --consumer counter`")
	parks := e.openParks()
	if len(parks) != 2 || parks[0].Instance != projection.SharedInstance {
		t.Fatalf("after the switch: open parks %+v, want t01 and t02 handed to the live shard", parks)
	}
	// A live park made after the switch, before the report is read, is not
	// the rebuild's.
	live := e.livePark("t90", "")
	if got := e.reportParks(); !strings.Contains(got, "2 streams parked by the rebuild") {
		t.Fatalf("report after a live park made after the switch:\n%s", got)
	}
	e.discardPark(live)

	// In place: the replay parks them anew once the old parks are gone...
	for _, p := range parks {
		if _, err := projection.DiscardPark(e.ctx, e.store, p.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	r := e.run(nil, "rebuild", "counter", "--in-place", "--wait")
	r.want(t, ExitOK, "done: replayed in place", "2 streams parked by the rebuild: see `projector parked list --consumer counter`")
	if len(e.openParks()) != 2 {
		t.Fatalf("after the in-place rebuild: open parks %+v", e.openParks())
	}
	// In place the live shards are the replay's: a park of an event past
	// the rebuild's target, even one made before its end was recorded, is
	// live, not the rebuild's; nor is one made after the end.
	cur, err := rebuild.Current(e.ctx, e.store, "counter")
	if err != nil {
		t.Fatal(err)
	}
	pastTarget := e.livePark("t91", "$1::timestamptz - interval '1 millisecond'", cur.FinishedAt)
	afterEnd := e.livePark("t92", "")
	if got := e.reportParks(); !strings.Contains(got, "2 streams parked by the rebuild") {
		t.Fatalf("report after live parks of events past the in-place rebuild's target:\n%s", got)
	}
	e.discardPark(pastTarget)
	e.discardPark(afterEnd)
	// ...and keeps them when they are there.
	r = e.run(nil, "rebuild", "counter", "--in-place", "--wait")
	r.want(t, ExitOK, "done: replayed in place", "2 streams parked before the rebuild still parked (an in-place rebuild keeps its parks)")
	if strings.Contains(r.out.String(), "by the rebuild") {
		t.Fatalf("kept parks counted as the replay's:\n%s", r.out.String())
	}

	// Held at ready, the shadow's parks are named before the diff.
	e.run(nil, "rebuild", "counter", "--diff").want(t, ExitOK,
		"2 streams parked by the new version so far: the switch hands them to the live consumer, held for a retry; see `projector parked list --consumer counter --instance __rebuild__`",
		"the rebuild is held")
	e.run(nil, "rebuild", "cancel", "counter").want(t, ExitOK, "cancel done")
}

// livePark appends an event to a new stream and files a park of it on the
// counter's live shard, as a live pass would, parked at parkedAt (an SQL
// expression over args; "" for now()); it returns the park's id.
func (e *rebuildEnv) livePark(stream, parkedAt string, args ...any) int64 {
	e.t.Helper()
	var ev projector.Event
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		res, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", stream), projector.NoStream, testevents.TicketOpened{Title: "live"})
		if err == nil {
			ev = res.Events[0]
		}
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	if parkedAt == "" {
		parkedAt = "now()"
	}
	n := len(args)
	var id int64
	if err := e.store.Pool().QueryRow(e.ctx, `INSERT INTO `+e.store.Table("projector_parks")+`
		(consumer, instance_id, tenant_id, stream_type, stream_id, event_id, event_type, version, error, attempts, parked_at)
		VALUES ('counter', $`+fmt.Sprint(n+1)+`, $`+fmt.Sprint(n+2)+`, 'ticket', $`+fmt.Sprint(n+3)+`, $`+fmt.Sprint(n+4)+`, $`+fmt.Sprint(n+5)+`, 1, 'live failure', 1, `+parkedAt+`)
		RETURNING id`, append(args, projection.SharedInstance, ev.Stream.Tenant, stream, ev.ID, ev.Type)...).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *rebuildEnv) discardPark(id int64) {
	e.t.Helper()
	if _, err := projection.DiscardPark(e.ctx, e.store, id, "test"); err != nil {
		e.t.Fatal(err)
	}
}

// reportParks is what `rebuild --wait` prints of the parks of the
// counter's latest rebuild, read now.
func (e *rebuildEnv) reportParks() string {
	e.t.Helper()
	r, err := rebuild.Current(e.ctx, e.store, "counter")
	if err != nil {
		e.t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := &cobra.Command{Use: "projector"}
	cmd.SetContext(e.ctx)
	if err := (&App{out: &out}).reportParks(cmd, e.store, r); err != nil {
		e.t.Fatal(err)
	}
	return out.String()
}
