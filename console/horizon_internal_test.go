package console

import (
	"testing"

	"github.com/projectorhq/projector/projection"
)

// The horizon holders' SQL is dropped from what the console shows without
// payloads enabled (an HTTP audit saw an ALTER ROLE … PASSWORD in
// state.json, read without signing in), and the report it came from is
// left as it was: the holder is copied, not changed in place.
func TestHideQueries(t *testing.T) {
	holder := &projection.HorizonHolder{PID: 7, Query: "alter role x password 'S3cret'"}
	others := []projection.HorizonHolder{{PID: 8, Query: "select 'S3cret'"}, {PID: 9}}
	h := projection.HorizonReport{Holder: holder, Others: others}
	hideQueries(&h)
	if h.Holder.Query != "" || h.Holder.PID != 7 || h.Others[0].Query != "" || h.Others[0].PID != 8 || len(h.Others) != 2 {
		t.Fatalf("hidden: %+v %+v", h.Holder, h.Others)
	}
	if holder.Query == "" || others[0].Query == "" {
		t.Fatal("hideQueries changed the report it was given")
	}
	var empty projection.HorizonReport
	hideQueries(&empty)
	if empty.Holder != nil || len(empty.Others) != 0 {
		t.Fatalf("an empty report: %+v", empty)
	}
}
