package postgres_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// historyOf writes a history file of customer.registered events with the
// given payloads, one stream per payload's customer.
func historyOf(t *testing.T, payloads ...string) *bytes.Buffer {
	t.Helper()
	return historyIn(t, "", payloads...)
}

// historyIn is historyOf with every event in stream customer/id, one after
// another, when id is not empty.
func historyIn(t *testing.T, id string, payloads ...string) *bytes.Buffer {
	t.Helper()
	var file bytes.Buffer
	enc := postgres.NewHistoryEncoder(&file)
	for k, p := range payloads {
		var c testevents.CustomerRegistered
		if err := json.Unmarshal([]byte(p), &c); err != nil {
			t.Fatal(err)
		}
		stream, version := c.Customer, int64(1)
		if id != "" {
			stream, version = id, int64(k+1)
		}
		if err := enc.Encode(postgres.HistoryEvent{
			Stream:  postgres.HistoryStream{Tenant: projector.SystemTenant, Type: "customer", ID: stream},
			Version: version, Type: "customer.registered", SchemaVersion: 1, ID: uuid.New(),
			RecordedAt: time.Now().UTC().Truncate(time.Microsecond), Payload: json.RawMessage(p),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &file
}

// TestImportSealsClearPersonalFields: a history file written by another
// tool holds personal fields in the clear; the import seals them as an
// append would, so projector_events never holds them in the clear
// (promise 19), and reads open them. It wrote them as they were before.
func TestImportSealsClearPersonalFields(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	file := historyOf(t,
		`{"customer":"c-1","name":"Ada Lovelace","email":"ada@example.com","plan":"pro"}`,
		`{"customer":"c-2","name":"Grace Hopper","email":null,"plan":"free"}`,
		`{"customer":"c-3","plan":"free"}`)
	res, err := f.store.Import(f.ctx, file, postgres.ImportOptions{})
	if err != nil || res.Imported != 3 {
		t.Fatalf("import: %+v, %v", res, err)
	}
	for id, data := range f.rawData(t) {
		for _, clear := range []string{"Ada", "ada@", "Grace"} {
			if strings.Contains(data, clear) {
				t.Fatalf("event %s stored %q in the clear: %s", id, clear, data)
			}
		}
	}
	for id, want := range map[string]string{"c-1": "Ada Lovelace", "c-2": "Grace Hopper", "c-3": ""} {
		evs := readCustomer(t, f.store, projector.SystemTenant, id)
		if len(evs) != 1 || evs[0].Payload.(testevents.CustomerRegistered).Name != want || evs[0].Forgotten {
			t.Fatalf("customer %s read back as %+v, want the name %q", id, evs, want)
		}
	}
	if n := f.count(t, "projector_subject_keys"); n != 2 {
		t.Fatalf("%d subject keys after the import, want 2 (c-3 holds no personal value)", n)
	}
}

// TestImportSealedPersonalFieldsNeedTheirKeys: an export's sealed fields
// imported into a schema without the subjects' keys were written, read as
// forgotten, and, once an append made the subject a new key, every read of
// them failed. The import now refuses them, naming the subject and the
// fix, and writes nothing of the batch; with the key rows copied first it
// imports them, and they open.
func TestImportSealedPersonalFieldsNeedTheirKeys(t *testing.T) {
	t.Parallel()
	src, file := adaExported(t)
	capture := &captureInline{}
	dst := personalFixture{ctx: src.ctx, types: src.types, // the same master key, another schema
		store: pgtest.Store(t, src.types.Registry, postgres.Config{MasterKey: masterKey(t, "k1", "one"), Inline: []postgres.InlineProjection{capture}})}
	_, err := dst.store.Import(dst.ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{})
	var lineErr *postgres.HistoryLineError
	if !errors.As(err, &lineErr) || lineErr.Line != 2 || !strings.Contains(err.Error(), "projector_subject_keys") {
		t.Fatalf("import of sealed fields without their key: %v; want a line 2 error naming projector_subject_keys", err)
	}
	if n := dst.count(t, "projector_events"); n != 0 {
		t.Fatalf("%d events written by the refused import", n)
	}
	if _, err := dst.store.Pool().Exec(dst.ctx, `INSERT INTO `+dst.store.Table("projector_subject_keys")+
		` SELECT * FROM `+src.store.Table("projector_subject_keys")); err != nil {
		t.Fatal(err)
	}
	if res, err := dst.store.Import(dst.ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{}); err != nil || res.Imported != 1 {
		t.Fatalf("import with the key rows copied: %+v, %v", res, err)
	}
	evs := readCustomer(t, dst.store, projector.SystemTenant, "c-1")
	if len(evs) != 1 || evs[0].Payload.(testevents.CustomerRegistered).Name != "Ada" {
		t.Fatalf("imported event read as %+v", evs)
	}
	// The inline projection saw the event as the read gives it, not its
	// envelopes.
	if got := capture.last(); got.Payload.(testevents.CustomerRegistered).Name != "Ada" || !jsonEqual(t, got.Data, evs[0].Data) {
		t.Fatalf("inline projection handed %+v (%s), the read gives %s", got.Payload, got.Data, evs[0].Data)
	}
}

// TestImportSealedUnderAnotherKeyRefused: the target schema has a subject
// of the same id with a key of its own (appended there): the file's
// envelopes do not open under it, and the import refuses them rather than
// write events every read of which would fail.
func TestImportSealedUnderAnotherKeyRefused(t *testing.T) {
	t.Parallel()
	src := personalSetup(t)
	c := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@example.com", Plan: "pro"}
	if err := src.register(t, src.store, projector.SystemTenant, c); err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if _, err := src.store.Export(src.ctx, &file, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	dst := personalSetup(t)
	if err := dst.appendCustomer(dst.store, projector.Stream("other", "x"), c); err != nil {
		t.Fatal(err)
	}
	_, err := dst.store.Import(dst.ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{})
	if !errors.Is(err, postgres.ErrInvalidHistory) || !strings.Contains(err.Error(), "does not open") {
		t.Fatalf("import of envelopes another key sealed: %v; want ErrInvalidHistory saying they do not open", err)
	}
	if n := dst.count(t, "projector_events"); n != 1 {
		t.Fatalf("%d events after the refused import, want the 1 appended", n)
	}
}

// TestImportForForgottenSubjectHidesTheValuesFromInline: an import of a
// forgotten subject's events hands its inline projections the events as
// every read returns them (personal fields null, Forgotten), for clear
// fields the import seals and for sealed ones alike. The import handed
// them the file's clear values, which an inline projection would have
// written into its model after the forget (promise 19).
func TestImportForForgottenSubjectHidesTheValuesFromInline(t *testing.T) {
	t.Parallel()
	src := personalSetup(t)
	if err := src.register(t, src.store, projector.SystemTenant, testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@example.com", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	var sealed bytes.Buffer
	if _, err := src.store.Export(src.ctx, &sealed, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	capture := &captureInline{}
	dst := personalFixture{ctx: src.ctx, types: src.types,
		store: pgtest.Store(t, src.types.Registry, postgres.Config{MasterKey: masterKey(t, "k1", "one"), Inline: []postgres.InlineProjection{capture}})}
	if _, err := dst.store.Pool().Exec(dst.ctx, `INSERT INTO `+dst.store.Table("projector_subject_keys")+
		` SELECT * FROM `+src.store.Table("projector_subject_keys")); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.store.Forget(dst.ctx, postgres.SubjectRef{Tenant: projector.SystemTenant, ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	for name, file := range map[string]*bytes.Buffer{
		"sealed": &sealed,
		"clear":  historyIn(t, "c-1-imported", `{"customer":"c-1","name":"Grace Hopper","email":"grace@example.com","plan":"free"}`),
	} {
		if res, err := dst.store.Import(dst.ctx, file, postgres.ImportOptions{}); err != nil || res.Imported != 1 {
			t.Fatalf("%s import for a forgotten subject: %+v, %v", name, res, err)
		}
		got := capture.last()
		c := got.Payload.(testevents.CustomerRegistered)
		if !got.Forgotten || c.Name != "" || c.Email != "" || strings.Contains(string(got.Data), "@example.com") {
			t.Fatalf("%s import: the inline projection was handed %+v (%s, Forgotten %v), want the personal fields null and Forgotten", name, c, got.Data, got.Forgotten)
		}
	}
	for id, data := range dst.rawData(t) {
		if strings.Contains(data, "Grace") || strings.Contains(data, "grace@") {
			t.Fatalf("event %s stored in the clear: %s", id, data)
		}
	}
}

// adaExported registers customer c-1 (Ada, sealed) in a fresh personal
// store and exports its log: the source of the tests that import sealed
// fields elsewhere.
func adaExported(t *testing.T) (personalFixture, *bytes.Buffer) {
	t.Helper()
	src := personalSetup(t)
	if err := src.register(t, src.store, projector.SystemTenant, testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@example.com", Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if res, err := src.store.Export(src.ctx, &file, postgres.ExportOptions{}); err != nil || res.Events != 1 {
		t.Fatalf("export: %+v, %v", res, err)
	}
	return src, &file
}
