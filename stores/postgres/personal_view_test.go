package postgres_test

import (
	"context"
	"encoding/json"
	"reflect"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// contactNoted is a personal event type whose personal fields may hold no
// value: phone absent (omitempty), note null (a nil pointer).
type contactNoted struct {
	Customer string  `json:"customer"`
	Phone    string  `json:"phone,omitempty"`
	Note     *string `json:"note"`
	Kind     string  `json:"kind"`
}

// contactNotedOne is contactNoted sealed in one envelope per event.
type contactNotedOne contactNoted

// captureInline records the events each append hands its inline
// projections.
type captureInline struct {
	mu     sync.Mutex
	events []projector.Event
}

func (c *captureInline) Name() string                       { return "capture" }
func (c *captureInline) Validate(*projector.Registry) error { return nil }
func (c *captureInline) ApplyInline(_ context.Context, _ pgx.Tx, events []projector.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, events...)
	return nil
}

func (c *captureInline) last() projector.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events[len(c.events)-1]
}

// jsonEqual reports whether a and b are the same JSON value, whatever the
// members' order and spacing (jsonb reorders them).
func jsonEqual(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

// TestAppendViewOfForgottenEqualsRead: for a forgotten subject, the event
// an append hands its inline projections (and returns) is the event every
// later read returns, in both envelope forms: with a value in a personal
// field, that field null and the event Forgotten; with no value in any
// (absent or null), the event as it was, not Forgotten. Before, the append
// marked every event of a forgotten subject Forgotten, and reads marked
// none of them (the fields were stored as null, which reads cannot tell
// from a null the caller passed).
func TestAppendViewOfForgottenEqualsRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := projector.NewRegistry()
	fields := []string{"phone", "note"}
	if _, err := projector.Define[contactNoted](reg, "contact.noted", projector.TypeConfig{
		Personal: projector.Personal{Subject: "customer", Fields: fields},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := projector.Define[contactNotedOne](reg, "contact.noted_one", projector.TypeConfig{
		Personal: projector.Personal{Subject: "customer", Fields: fields, OneEnvelope: true},
	}); err != nil {
		t.Fatal(err)
	}
	capture := &captureInline{}
	store := pgtest.Store(t, reg, postgres.Config{MasterKey: masterKey(t, "k1", "one"), Inline: []postgres.InlineProjection{capture}})
	stream := projector.TenantStream("acme", "contact", "c-1")
	note := "call back"
	appendOne := func(p any) projector.Event {
		t.Helper()
		var res postgres.AppendResult
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			var err error
			res, err = store.Append(ctx, tx, stream, projector.AnyVersion, p)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return res.Events[0]
	}
	appendOne(contactNoted{Customer: "c-1", Phone: "555", Note: &note, Kind: "before"})
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		p         contactNoted
		forgotten bool
	}{
		{"no value", contactNoted{Customer: "c-1", Kind: "none"}, false},
		{"phone", contactNoted{Customer: "c-1", Phone: "555", Kind: "phone"}, true},
		{"note", contactNoted{Customer: "c-1", Note: &note, Kind: "note"}, true},
		{"both", contactNoted{Customer: "c-1", Phone: "555", Note: &note, Kind: "both"}, true},
	}
	for _, one := range []bool{false, true} {
		for _, c := range cases {
			var p any = c.p
			if one {
				p = contactNotedOne(c.p)
			}
			returned := appendOne(p)
			inline := capture.last()
			evs, err := store.ReadStream(ctx, stream, postgres.StreamQuery{})
			if err != nil {
				t.Fatal(err)
			}
			read := evs[len(evs)-1]
			what := func() string {
				return c.name + map[bool]string{false: "", true: " (one envelope)"}[one]
			}
			if read.ID != inline.ID || returned.ID != inline.ID {
				t.Fatalf("%s: the inline projection got event %s, the append returned %s, the read's last is %s", what(), inline.ID, returned.ID, read.ID)
			}
			if inline.Forgotten != c.forgotten || read.Forgotten != c.forgotten || returned.Forgotten != c.forgotten {
				t.Errorf("%s: forgotten: inline %v, returned %v, read %v; want %v in all", what(), inline.Forgotten, returned.Forgotten, read.Forgotten, c.forgotten)
			}
			if !reflect.DeepEqual(inline.Payload, read.Payload) || !reflect.DeepEqual(returned.Payload, read.Payload) {
				t.Errorf("%s: payload: inline %+v, returned %+v, read %+v", what(), inline.Payload, returned.Payload, read.Payload)
			}
			if !jsonEqual(t, inline.Data, read.Data) || !jsonEqual(t, returned.Data, read.Data) {
				t.Errorf("%s: data: inline %s, returned %s, read %s", what(), inline.Data, returned.Data, read.Data)
			}
			var got contactNoted
			if err := json.Unmarshal(read.Data, &got); err != nil {
				t.Fatal(err)
			}
			if got.Phone != "" || got.Note != nil || got.Kind != c.p.Kind || got.Customer != "c-1" {
				t.Errorf("%s: the read gives %+v, want no personal value, the rest kept", what(), got)
			}
		}
	}
}
