package postgres_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// inPayloadRegistry declares CustomerRegistered as testevents does, with
// its one envelope inside the payload (no EnvelopeApart): the form rows
// written before migration 29, or by a deployment that has not turned
// EnvelopeApart on, have.
func inPayloadRegistry() *projector.Registry {
	r := projector.NewRegistry()
	projector.MustDefine[testevents.CustomerRegistered](r, "customer.registered", projector.TypeConfig{
		Personal: projector.Personal{Subject: "customer", Fields: []string{"name", "email"}, OneEnvelope: true},
	})
	return r
}

// envelopeColumns returns the stored payload and envelope of every event
// of stream type customer, by stream id.
func (f personalFixture) envelopeColumns(t *testing.T) (payloads map[string]string, envelopes map[string][]byte) {
	t.Helper()
	rows, err := f.store.Pool().Query(f.ctx, `SELECT stream_id, data::text, envelope FROM `+f.store.Table("projector_events")+
		` WHERE stream_type = 'customer'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	payloads, envelopes = map[string]string{}, map[string][]byte{}
	for rows.Next() {
		var id, data string
		var env []byte
		if err := rows.Scan(&id, &data, &env); err != nil {
			t.Fatal(err)
		}
		payloads[id], envelopes[id] = data, env
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return payloads, envelopes
}

// TestEnvelopeApartFormsReadTheSame: with EnvelopeApart, the events table
// holds the envelope in its own column and only placeholders in the
// payload; rows of both forms, in one stream, read back the same through
// stores of either declaration; a registry that declares nothing personal
// (the stock binary) and an export see the envelope back in the payload,
// the one form the export format and the relay carry.
func TestEnvelopeApartFormsReadTheSame(t *testing.T) {
	t.Parallel()
	f := personalSetup(t) // testevents: EnvelopeApart
	inPayload, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: inPayloadRegistry(),
		MasterKey: masterKey(t, "k1", "one")})
	if err != nil {
		t.Fatal(err)
	}
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}
	bob := testevents.CustomerRegistered{Customer: "c-2", Name: "Bob Babbage", Email: "bob@example.com", Plan: "free"}
	stream := projector.Stream("customer", "mixed")
	if err := f.appendCustomer(inPayload, stream, ada); err != nil {
		t.Fatal(err)
	}
	if err := f.appendCustomer(f.store, stream, bob); err != nil {
		t.Fatal(err)
	}
	// In-payload again after an apart row: a read's row must not keep the
	// envelope of the row before it.
	carl := testevents.CustomerRegistered{Customer: "c-3", Name: "Carl Gauss", Email: "carl@example.com", Plan: "pro"}
	if err := f.appendCustomer(inPayload, stream, carl); err != nil {
		t.Fatal(err)
	}
	rows, err := f.store.Pool().Query(f.ctx, `SELECT data::text, envelope FROM `+f.store.Table("projector_events")+` ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	var stored []string
	var envs [][]byte
	for rows.Next() {
		var data string
		var env []byte
		if err := rows.Scan(&data, &env); err != nil {
			t.Fatal(err)
		}
		stored, envs = append(stored, data), append(envs, env)
	}
	if rows.Err() != nil || len(stored) != 3 {
		t.Fatalf("%d rows: %v", len(stored), rows.Err())
	}
	if envs[0] != nil || envs[2] != nil || strings.Count(stored[0], `"pjx2."`) != 1 {
		t.Fatalf("in-payload row: envelope column %x, payload %s", envs[0], stored[0])
	}
	if len(envs[1]) < 28 || strings.Count(stored[1], `"pjx2."`) != 2 || bytes.Contains(envs[1], []byte("Bob")) {
		t.Fatalf("apart row: envelope column %x, payload %s", envs[1], stored[1])
	}
	for name, s := range map[string]*postgres.Store{"apart": f.store, "in-payload": inPayload} {
		evs, err := s.ReadStream(f.ctx, stream, postgres.StreamQuery{})
		if err != nil || len(evs) != 3 || evs[0].Payload != ada || evs[1].Payload != bob || evs[2].Payload != carl {
			t.Fatalf("%s store read %+v, %v", name, evs, err)
		}
		log := readLogN(t, f.ctx, s, postgres.LogQuery{Raw: true}, 3)
		if !strings.Contains(string(log[1].Data), "bob@example.com") {
			t.Fatalf("%s store's raw log read: %s", name, log[1].Data)
		}
	}

	// The stock binary's view: nothing declared personal, the envelope in
	// the payload as base64, as the in-payload row holds it.
	stock := projector.NewRegistry()
	projector.MustDefine[testevents.CustomerPlain](stock, "customer.registered")
	plain, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: stock})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := plain.ReadStream(f.ctx, stream, postgres.StreamQuery{})
	if err != nil || len(evs) != 3 {
		t.Fatalf("stock read %d events: %v", len(evs), err)
	}
	wantEnv := "pjx2." + base64.RawURLEncoding.EncodeToString(envs[1])
	if got := evs[1].Payload.(testevents.CustomerPlain); got.Name != wantEnv && got.Email != wantEnv {
		t.Fatalf("stock read of the apart row: %+v, want one field %q", got, wantEnv)
	}

	var out bytes.Buffer
	if _, err := f.store.Export(f.ctx, &out, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	exported := decodeHistory(t, &out)
	if len(exported) != 3 || !strings.Contains(string(exported[1].Payload), `"`+wantEnv+`"`) ||
		strings.Count(string(exported[1].Payload), `"pjx2."`) != 1 {
		t.Fatalf("export: %d events, the apart one %s", len(exported), exported[1].Payload)
	}

	// Archived and back: the envelope moves with its row.
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{stream}}); err != nil || res.Events != 3 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	evs, err = f.store.ReadStream(f.ctx, stream, postgres.StreamQuery{IncludeArchived: true})
	if err != nil || len(evs) != 3 || evs[1].Payload != bob || evs[2].Payload != carl {
		t.Fatalf("archived read %+v, %v", evs, err)
	}
	if res, err := f.store.Unarchive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{stream}}); err != nil || res.Events != 3 {
		t.Fatalf("unarchive: %+v, %v", res, err)
	}
	var back []byte
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT envelope FROM `+f.store.Table("projector_events")+
		` WHERE stream_id = 'mixed' AND version = 2`).Scan(&back); err != nil || !bytes.Equal(back, envs[1]) {
		t.Fatalf("after unarchive the envelope column holds %x (%v), want %x", back, err, envs[1])
	}
}

// TestEnvelopeApartDamagedRows: an envelope moved to another subject's
// event does not open, nor one beside a payload with no place for it;
// both fail the read with ErrSealed rather than return a payload.
func TestEnvelopeApartDamagedRows(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	for _, c := range []testevents.CustomerRegistered{
		{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"},
		{Customer: "c-2", Name: "Bob Babbage", Email: "bob@example.com", Plan: "free"},
	} {
		if err := f.appendCustomer(f.store, projector.Stream("customer", c.Customer), c); err != nil {
			t.Fatal(err)
		}
	}
	events := f.store.Table("projector_events")
	read := func(id string) error {
		_, err := f.store.ReadStream(f.ctx, projector.Stream("customer", id), postgres.StreamQuery{})
		return err
	}
	for _, id := range []string{"c-1", "c-2"} {
		if err := read(id); err != nil {
			t.Fatalf("read %s before: %v", id, err)
		}
	}
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+events+` SET envelope = (SELECT envelope FROM `+events+
		` WHERE stream_id = 'c-2') WHERE stream_id = 'c-1'`); err != nil {
		t.Fatal(err)
	}
	// A fresh process (no cached key) and this one (cached) both refuse.
	for name, s := range map[string]*postgres.Store{"this": f.store, "fresh": f.otherProcess(t)} {
		if _, err := s.ReadStream(f.ctx, projector.Stream("customer", "c-1"), postgres.StreamQuery{}); !errors.Is(err, projector.ErrSealed) {
			t.Fatalf("%s process read an envelope moved to another subject: %v", name, err)
		}
	}
	// The payload's placeholders gone: the envelope has no place.
	placed, _ := json.Marshal(map[string]string{"customer": "c-2", "name": "x", "email": "y", "plan": "free"})
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+events+` SET data = $1::jsonb WHERE stream_id = 'c-2'`, string(placed)); err != nil {
		t.Fatal(err)
	}
	if err := read("c-2"); !errors.Is(err, projector.ErrSealed) {
		t.Fatalf("read of an envelope beside a payload with no placeholder: %v", err)
	}
	if _, err := f.store.Export(f.ctx, io.Discard, postgres.ExportOptions{}); !errors.Is(err, projector.ErrSealed) {
		t.Fatalf("export of the same rows: %v", err)
	}
}

// decodeHistory reads every event of an export.
func decodeHistory(t *testing.T, r io.Reader) []postgres.HistoryEvent {
	t.Helper()
	dec := postgres.NewHistoryDecoder(r)
	var out []postgres.HistoryEvent
	for {
		var h postgres.HistoryEvent
		if err := dec.Next(&h); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
}

// TestImportKeepsEnvelopeApart: an import of a type declared EnvelopeApart
// writes its rows as an append does, the envelope in its column: both the
// lines a history file carries sealed (the envelope inside the payload, as
// an export writes them) and clear lines the import seals. They read back
// as written, and export again as they were exported.
func TestImportKeepsEnvelopeApart(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}
	if err := f.appendCustomer(f.store, projector.Stream("customer", "a"), ada); err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if _, err := f.store.Export(f.ctx, &file, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	exported := decodeHistory(t, bytes.NewReader(file.Bytes()))
	if len(exported) != 1 || strings.Count(string(exported[0].Payload), `"pjx2.`) != 2 {
		t.Fatalf("exported %+v", exported)
	}
	// A clear line of another subject, which the import seals.
	eve := testevents.CustomerRegistered{Customer: "c-9", Name: "Eve Clear", Email: "eve@example.com", Plan: "free"}
	clear := exported[0]
	clear.ID, clear.Stream.ID = uuid.New(), "e"
	clear.Payload, _ = json.Marshal(eve)
	line, err := json.Marshal(clear)
	if err != nil {
		t.Fatal(err)
	}
	file.Write(append(line, '\n'))

	into := pgtest.Store(t, f.types.Registry, postgres.Config{MasterKey: masterKey(t, "k1", "one")})
	if _, err := into.Pool().Exec(f.ctx, `INSERT INTO `+into.Table("projector_subject_keys")+
		` SELECT * FROM `+f.store.Table("projector_subject_keys")); err != nil {
		t.Fatal(err)
	}
	if res, err := into.Import(f.ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{}); err != nil || res.Imported != 2 {
		t.Fatalf("import: %+v, %v", res, err)
	}
	// Again: both lines are the log's events (the apart one compared split
	// as it is stored; the clear one, sealed on import, not compared).
	if res, err := into.Import(f.ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{}); err != nil || res.Skipped != 2 {
		t.Fatalf("import again: %+v, %v", res, err)
	}
	g := personalFixture{ctx: f.ctx, types: f.types, store: into}
	payloads, envelopes := g.envelopeColumns(t)
	for _, id := range []string{"a", "e"} {
		if len(envelopes[id]) < 28 || strings.Count(payloads[id], `"pjx2."`) != 2 {
			t.Fatalf("imported %s: payload %s, envelope column %x", id, payloads[id], envelopes[id])
		}
	}
	for id, want := range map[string]testevents.CustomerRegistered{"a": ada, "e": eve} {
		evs, err := into.ReadStream(f.ctx, projector.Stream("customer", id), postgres.StreamQuery{})
		if err != nil || len(evs) != 1 || evs[0].Payload != want {
			t.Fatalf("read imported %s: %+v, %v", id, evs, err)
		}
	}
	var again bytes.Buffer
	if _, err := into.Export(f.ctx, &again, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if re := decodeHistory(t, &again); len(re) != 2 || !bytes.Equal(re[0].Payload, exported[0].Payload) {
		t.Fatalf("exported again: %+v, want the first line's payload %s", re, exported[0].Payload)
	}

	// An envelope that is not base64url fails its line, nothing written.
	bad := exported[0]
	bad.ID, bad.Stream.ID = uuid.New(), "bad"
	bad.Payload = json.RawMessage(strings.Replace(string(bad.Payload), `"pjx2.`+string(bytes.Split(bytes.Split(bad.Payload, []byte(`"pjx2.`))[1], []byte(`"`))[0]), `"pjx2.!!!!`, 1))
	line, _ = json.Marshal(bad)
	if _, err := into.Import(f.ctx, bytes.NewReader(append(line, '\n')), postgres.ImportOptions{}); err == nil {
		t.Fatalf("an import of a malformed envelope succeeded: %s", bad.Payload)
	}
	if _, envs := g.envelopeColumns(t); len(envs) != 2 {
		t.Fatalf("after the refused line: %d rows", len(envs))
	}
}
