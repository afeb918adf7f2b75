package projection_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// A pass whose COMMIT the server refuses (here a deferred constraint
// trigger on the read model, checked only at COMMIT) has applied nothing:
// its cursor passes no event and no event counts, however many passes
// are refused; once the constraint lets the writes through, every event is
// applied exactly once, and AfterCommit is handed only the events of the
// commit that went through. The pass's advance and COMMIT go out as one
// pipeline (advanceCommit, commitBatch): a refusal there must not be taken
// for a committed batch.
func TestRefusedCommitAppliesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	refusals := e.table("refusals")
	e.exec(`CREATE TABLE ` + e.table("gate") + ` (open bool NOT NULL)`)
	e.exec(`INSERT INTO ` + e.table("gate") + ` VALUES (false)`)
	e.exec(`CREATE SEQUENCE ` + refusals)
	e.exec(`CREATE FUNCTION ` + e.table("refuse") + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NOT (SELECT open FROM ` + e.table("gate") + `) THEN
				PERFORM nextval('` + refusals + `'); -- not rolled back with the refusal
				RAISE EXCEPTION 'refused at commit';
			END IF;
			RETURN NULL;
		END $$`)
	e.exec(`CREATE CONSTRAINT TRIGGER refuse AFTER INSERT OR UPDATE ON ` + e.table("counts") + `
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + e.table("refuse") + `()`)

	var announced atomic.Int64 // events AfterCommit was handed
	p := counting(e.schema, e.types, "refused", projection.AsyncConfig{BatchSize: 10,
		AfterCommit: func(evs []projector.Event) { announced.Add(int64(len(evs))) }})
	want := e.appendMany(2, 30, 3)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Recheck: 20 * time.Millisecond})
	eventually(t, 30*time.Second, "three refused commits", func() bool {
		var n int64
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT last_value FROM `+refusals+` WHERE is_called`).Scan(&n); err != nil {
			return false // not called yet: no row
		}
		return n >= 3
	})
	// The cursor may move on with the horizon in passes that read nothing
	// (other sessions' transactions held the horizon below these events),
	// but never past an event of the log.
	var passed int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")+` ev, `+
		e.store.Table("projector_consumers")+` c WHERE c.name = 'refused' AND c.instance_id = $1
		AND (ev.tx_id, ev.seq) <= (c.cursor_tx_id, c.cursor_seq)`, projection.SharedInstance).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	if passed != 0 {
		t.Fatalf("the cursor passed %d events after refused commits, want none", passed)
	}
	if got, _ := e.counts("refused"); len(got) != 0 {
		t.Fatalf("counts %v written by refused commits", got)
	}
	if n := announced.Load(); n != 0 {
		t.Fatalf("AfterCommit handed %d events of refused commits", n)
	}
	e.exec(`UPDATE ` + e.table("gate") + ` SET open = true`)
	e.catchUp(d)
	e.checkCounts("refused", want)
	if n, all := announced.Load(), total(want); n != all {
		t.Errorf("AfterCommit handed %d events, want each of the %d once", n, all)
	}
}
