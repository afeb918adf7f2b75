package jetstream_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/projectorhq/projector"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

type noteV2 struct {
	Text  string `json:"text"`
	Words int    `json:"words"`
}

// registry has "note.added" at schema version 2, with an upcaster from 1.
func registry(t testing.TB) *projector.Registry {
	t.Helper()
	r := projector.NewRegistry()
	_, err := projector.Define[noteV2](r, "note.added", projector.TypeConfig{SchemaVersion: 2, Upcasters: []projector.Upcaster{
		{From: 1, Func: func(data json.RawMessage) (json.RawMessage, error) {
			var v1 struct{ Text string }
			if err := json.Unmarshal(data, &v1); err != nil {
				return nil, err
			}
			return json.Marshal(noteV2{Text: v1.Text, Words: len(strings.Fields(v1.Text))})
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func sampleEvent() projector.Event {
	return projector.Event{
		ID:            uuid.New(),
		Stream:        projector.TenantStream("acme.eu >*", "note%book", "id with\nnewline"),
		Version:       7,
		Position:      projector.Position{TxID: 981, Seq: 12},
		Type:          "note.added",
		SchemaVersion: 1,
		Data:          json.RawMessage(`{"text":"two words"}`),
		Metadata: projector.Metadata{CorrelationID: uuid.New(), CausationID: uuid.New(), Actor: "agent:ann\r\n%",
			Headers: map[string]string{"trace": "abc"}},
		RecordedAt: time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC),
	}
}

// A message decodes back to the appended event, upcast through the
// registry, whatever characters its names hold; the subject keeps exactly
// four tokens under a one-token prefix.
func TestDecodeRoundTripUpcasts(t *testing.T) {
	reg := registry(t)
	ev := sampleEvent()
	msg, err := pjs.NewMsg("p", ev)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(msg.Subject, "."); got != 3 || strings.ContainsAny(msg.Subject, "*> \n") {
		t.Fatalf("subject %q", msg.Subject)
	}
	if msg.Subject != "p.acme%2Eeu%20%3E%2A.note%25book.note%2Eadded" {
		t.Fatalf("subject %q", msg.Subject)
	}
	for k, vs := range msg.Header {
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n") {
				t.Fatalf("header %s carries a line break: %q", k, v)
			}
		}
	}
	got, err := pjs.Decode(reg, msg.Header, msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != ev.ID || got.Stream != ev.Stream || got.Version != ev.Version || got.Position != ev.Position ||
		got.Metadata.CorrelationID != ev.Metadata.CorrelationID || got.Metadata.CausationID != ev.Metadata.CausationID ||
		got.Metadata.Actor != ev.Metadata.Actor || got.Metadata.Headers["trace"] != "abc" || !got.RecordedAt.Equal(ev.RecordedAt) {
		t.Fatalf("decoded %+v, want %+v", got, ev)
	}
	if got.SchemaVersion != 2 || got.Payload != (noteV2{Text: "two words", Words: 2}) {
		t.Fatalf("payload %#v at v%d, want the upcast v2", got.Payload, got.SchemaVersion)
	}
}

func TestDecodeRefusesBadMessages(t *testing.T) {
	reg := registry(t)
	good, err := pjs.NewMsg("p", sampleEvent())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		change  func(h nats.Header) []byte
		wantErr error
	}{
		{"no event id", func(h nats.Header) []byte { h.Del(pjs.HeaderEventID); return good.Data }, pjs.ErrInvalidMessage},
		{"bad version", func(h nats.Header) []byte { h.Set(pjs.HeaderVersion, "0"); return good.Data }, pjs.ErrInvalidMessage},
		{"bad escape", func(h nats.Header) []byte { h.Set(pjs.HeaderTenant, "a%Z1"); return good.Data }, pjs.ErrInvalidMessage},
		{"bad time", func(h nats.Header) []byte { h.Set(pjs.HeaderRecordedAt, "yesterday"); return good.Data }, pjs.ErrInvalidMessage},
		{"unknown type", func(h nats.Header) []byte { h.Set(pjs.HeaderEventType, "note.deleted"); return good.Data }, projector.ErrUnknownEventType},
		{"future schema", func(h nats.Header) []byte { h.Set(pjs.HeaderSchemaVersion, "3"); return good.Data }, projector.ErrInvalidPayload},
		{"bad payload", func(nats.Header) []byte { return []byte(`{"text":`) }, projector.ErrInvalidPayload},
		// PostgreSQL cannot store a NUL: the handler's insert failed and the
		// message went round to MaxDeliver (a relay and saga audit).
		{"NUL in the actor", func(h nats.Header) []byte { h.Set(pjs.HeaderActor, "a%00b"); return good.Data }, pjs.ErrInvalidMessage},
		{"NUL in a header", func(h nats.Header) []byte { h.Set(pjs.HeaderMetadata, `{"k":"a\u0000b"}`); return good.Data }, pjs.ErrInvalidMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := nats.Header{}
			for k, v := range good.Header {
				h[k] = append([]string(nil), v...)
			}
			data := tc.change(h)
			if _, err := pjs.Decode(reg, h, data); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Decode: %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestEscapeToken(t *testing.T) {
	for in, want := range map[string]string{
		"ticket":        "ticket",
		"ticket.opened": "ticket%2Eopened",
		"":              "%",
		"\x00":          "%00",
		"a*b>c d%":      "a%2Ab%3Ec%20d%25",
		"é":             "%C3%A9",
	} {
		if got := pjs.EscapeToken(in); got != want {
			t.Errorf("EscapeToken(%q) = %q, want %q", in, got, want)
		}
		if back, err := pjs.UnescapeToken(want); err != nil || back != in {
			t.Errorf("UnescapeToken(%q) = %q, %v", want, back, err)
		}
	}
}

// FuzzEscapeToken: any string escapes to one token of safe bytes and back.
func FuzzEscapeToken(f *testing.F) {
	for _, s := range []string{"", "a.b", "*", ">", "%", "a b\tc", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := pjs.EscapeToken(s)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("EscapeToken(%q) = %q is not one safe token", s, tok)
		}
		if back, err := pjs.UnescapeToken(tok); err != nil || back != s {
			t.Fatalf("round trip of %q: %q, %v", s, back, err)
		}
	})
}

// FuzzDecode: arbitrary headers and bodies never panic, and whatever
// decodes is a valid event of a defined type.
func FuzzDecode(f *testing.F) {
	good, err := pjs.NewMsg("p", sampleEvent())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good.Header.Get(pjs.HeaderTenant), good.Header.Get(pjs.HeaderStreamID), good.Header.Get(pjs.HeaderSchemaVersion),
		good.Header.Get(pjs.HeaderPosition), good.Header.Get(pjs.HeaderMetadata), good.Data)
	f.Add("%", "%0", "0", "1/x", "{", []byte("null"))
	reg := registry(f)
	f.Fuzz(func(t *testing.T, tenant, streamID, schema, pos, meta string, data []byte) {
		h := nats.Header{}
		for k, v := range good.Header {
			h[k] = append([]string(nil), v...)
		}
		h.Set(pjs.HeaderTenant, tenant)
		h.Set(pjs.HeaderStreamID, streamID)
		h.Set(pjs.HeaderSchemaVersion, schema)
		h.Set(pjs.HeaderPosition, pos)
		h.Set(pjs.HeaderMetadata, meta)
		ev, err := pjs.Decode(reg, h, data)
		if err != nil {
			return
		}
		if err := ev.Stream.Validate(); err != nil {
			t.Fatalf("decoded an invalid stream: %v", err)
		}
		if _, ok := ev.Payload.(noteV2); !ok || ev.SchemaVersion != 2 {
			t.Fatalf("decoded payload %#v at v%d", ev.Payload, ev.SchemaVersion)
		}
	})
}
