package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
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
		"2 streams parked during the rebuild: see `projector parked list --consumer counter`")
	parks := e.openParks()
	if len(parks) != 2 || parks[0].Instance != projection.SharedInstance {
		t.Fatalf("after the switch: open parks %+v, want t01 and t02 handed to the live shard", parks)
	}

	// In place: the replay parks them anew once the old parks are gone...
	for _, p := range parks {
		if _, err := projection.DiscardPark(e.ctx, e.store, p.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	r := e.run(nil, "rebuild", "counter", "--in-place", "--wait")
	r.want(t, ExitOK, "done: replayed in place", "2 streams parked during the rebuild: see `projector parked list --consumer counter`")
	if len(e.openParks()) != 2 {
		t.Fatalf("after the in-place rebuild: open parks %+v", e.openParks())
	}
	// ...and keeps them when they are there.
	r = e.run(nil, "rebuild", "counter", "--in-place", "--wait")
	r.want(t, ExitOK, "done: replayed in place", "2 streams parked before the rebuild still parked (an in-place rebuild keeps its parks)")
	if strings.Contains(r.out.String(), "during the rebuild") {
		t.Fatalf("kept parks counted as the replay's:\n%s", r.out.String())
	}

	// Held at ready, the shadow's parks are named before the diff.
	e.run(nil, "rebuild", "counter", "--diff").want(t, ExitOK,
		"2 streams parked by the new version so far: the switch hands them to the live consumer, held for a retry; see `projector parked list --consumer counter --instance __rebuild__`",
		"the rebuild is held")
	e.run(nil, "rebuild", "cancel", "counter").want(t, ExitOK, "cancel done")
}
