package postgres

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
)

// exportedLine is one line as HistoryEncoder writes it.
func exportedLine(t testing.TB, h HistoryEvent) []byte {
	var buf bytes.Buffer
	enc := NewHistoryEncoder(&buf)
	if err := enc.Encode(h); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	return lines[len(lines)-1]
}

// TestDecodeHistoryLineTakesExportedLines: the lines Export writes, with
// every field set or only the required ones, take the fast path, and come
// out as json.Unmarshal makes them.
func TestDecodeHistoryLineTakesExportedLines(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 4, 5, 6, 7, 891234000, time.FixedZone("x", 3600))
	for _, h := range []HistoryEvent{
		{Stream: HistoryStream{Tenant: "system", Type: "ticket", ID: "a-1"}, Version: 7, Type: "ticket.commented", SchemaVersion: 2,
			ID: uuid.Must(uuid.NewV7()), RecordedAt: at, Payload: json.RawMessage(`{"body":"é <b> \"q\"","n":[1,2.5e3,null]}`),
			Metadata: HistoryMetadata{CorrelationID: uuid.Must(uuid.NewV7()), CausationID: uuid.Must(uuid.NewV7()), Actor: "ann\tb",
				Headers: map[string]string{"traceparent": "00-x", "k\n": "v\u2028"}}},
		{Stream: HistoryStream{Tenant: "acme", Type: "t", ID: "1"}, Version: 1, Type: "x", SchemaVersion: 1,
			ID: uuid.Must(uuid.NewV7()), RecordedAt: at.UTC(), Payload: json.RawMessage(`"s"`)},
	} {
		line := exportedLine(t, h)
		var fast, slow HistoryEvent
		if !decodeHistoryLine(line, &fast) {
			t.Fatalf("an exported line is not on the fast path: %s", line)
		}
		if stream, version, ok := prescanHistoryLine(line); !ok || prescanStream(stream) != h.Stream.Ref() || version != h.Version {
			t.Fatalf("prescan of %s: %q version %d, %v", line, stream, version, ok)
		}
		if err := json.Unmarshal(line, &slow); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast path decoded %s as\n%+v\nencoding/json as\n%+v", line, fast, slow)
		}
	}
}

// FuzzHistoryLine: the fast path never accepts a line json.Unmarshal
// refuses, and what it accepts it decodes exactly as json.Unmarshal does.
func FuzzHistoryLine(f *testing.F) {
	f.Add([]byte(`{"stream":{"tenant":"t","type":"s","id":"i"},"version":1,"type":"x","schema_version":1,` +
		`"id":"0190a4c8-0000-7000-8000-000000000001","recorded_at":"2026-01-01T00:00:00Z","payload":[1,"\u00e9"],` +
		`"metadata":{"correlation_id":"0190a4c8-0000-7000-8000-000000000002","actor":"a","headers":{"k":"v"}}}`))
	f.Add([]byte(`{"stream":{"tenant":"t\u0041","type":"s","id":"i"},"version":-0,"type":"x","schema_version":01,"payload":{"a":}}`))
	f.Add([]byte(`{"Version":1,"version":2,"version":3}`))
	f.Add([]byte(`{"metadata":{"headers":{"a":"b","a":"c","\u00e9":"\xff"}},"id":"{0190a4c8-0000-7000-8000-000000000001}"}`))
	f.Add([]byte(`{"recorded_at":"2026-13-01T00:00:00Z","payload":nul,"stream":null}`))
	f.Add([]byte(`{"stream":{"tenant":"t","type":"s","id":"i"},"version":1,"stream":{"tenant":"t","type":"s","id":"j"}}`))
	f.Add([]byte(`{"stream":{"tenant":"t","type":"s\"","id":"i"},"version":12 ,"type":"x"}`))
	f.Add([]byte(`{"version":9223372036854775808,"schema_version":1e3,"payload":"\ud800"} x`))
	f.Fuzz(func(t *testing.T, line []byte) {
		var fast, slow HistoryEvent
		ok := decodeHistoryLine(line, &fast)
		err := json.Unmarshal(line, &slow)
		// The import's prescan of a line's stream and version agrees
		// with the decoding wherever the fast path takes the line (where
		// only encoding/json does, the import compares the two).
		if stream, version, pre := prescanHistoryLine(line); pre && ok && (prescanStream(stream) != fast.Stream.Ref() || version != fast.Version) {
			ref := prescanStream(stream)
			t.Fatalf("prescan read %q as %s version %d, the fast path as %s version %d", line, ref, version, fast.Stream.Ref(), fast.Version)
		}
		// The import's decoding, reusing the strings of the line before
		// (here the same line) and the payload's bytes, decodes alike.
		c := &lineCache{alias: true}
		for range 2 {
			var cached HistoryEvent
			if got := decodeHistoryLineWith(line, &cached, c); got != ok || (ok && !reflect.DeepEqual(cached, fast)) {
				t.Fatalf("with a cache, %q decoded as %v\n%+v\nwithout as %v\n%+v", line, got, cached, ok, fast)
			}
		}
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("fast path accepted %q, which encoding/json refuses: %v", line, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast path decoded %q as\n%+v\nencoding/json as\n%+v", line, fast, slow)
		}
	})
}

// BenchmarkDecodeHistoryLine: one exported line through the fast path
// and through encoding/json, per line.
func BenchmarkDecodeHistoryLine(b *testing.B) {
	line := exportedLine(b, HistoryEvent{Stream: HistoryStream{Tenant: "system", Type: "ticket", ID: "imp-1-17"}, Version: 42,
		Type: "ticket.commented", SchemaVersion: 1, ID: uuid.Must(uuid.NewV7()), RecordedAt: time.Now().UTC(),
		Payload:  json.RawMessage(`{"body":"the printer is on fire again","n":1742}`),
		Metadata: HistoryMetadata{CorrelationID: uuid.Must(uuid.NewV7())}})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h HistoryEvent
			if !decodeHistoryLine(line, &h) {
				b.Fatal("not on the fast path")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h HistoryEvent
			if err := json.Unmarshal(line, &h); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkImportBatchDecode: the import's client work on one batch of
// 10,000 exported lines, without a database: reading and prescanning the
// lines, then decoding, checking and encoding them as COPY rows on one
// worker; per event.
func BenchmarkImportBatchDecode(b *testing.B) { benchImportBatchDecode(b, false) }

// BenchmarkImportBatchDecodeReused is BenchmarkImportBatchDecode reading
// each time into the same batch, reset, as an import reads into the
// batches its writer is done with.
func BenchmarkImportBatchDecodeReused(b *testing.B) { benchImportBatchDecode(b, true) }

func benchImportBatchDecode(b *testing.B, reuse bool) {
	const n = 10_000
	types := testevents.New()
	var buf bytes.Buffer
	enc := NewHistoryEncoder(&buf)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		data, _ := json.Marshal(testevents.TicketCommented{Body: "the printer is on fire again", N: i})
		if err := enc.Encode(HistoryEvent{
			Stream:  HistoryStream{Tenant: projector.SystemTenant, Type: "ticket", ID: fmt.Sprintf("imp-%d", i/100)},
			Version: int64(i%100 + 1), Type: "ticket.commented", SchemaVersion: 1, ID: uuid.Must(uuid.NewV7()),
			RecordedAt: at.Add(time.Duration(i) * time.Millisecond), Payload: data,
			Metadata: HistoryMetadata{CorrelationID: uuid.Must(uuid.NewV7())},
		}); err != nil {
			b.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		b.Fatal(err)
	}
	file := buf.Bytes()
	b.ReportAllocs()
	batch := &importBatch{}
	for b.Loop() {
		dec := NewHistoryDecoder(bytes.NewReader(file))
		if _, err := dec.Header(); err != nil {
			b.Fatal(err)
		}
		if reuse {
			batch.reset()
		} else {
			batch = &importBatch{}
		}
		if done := batch.read(dec, n, len(file)); batch.readErr != nil || done {
			b.Fatalf("read: %v, done %v", batch.readErr, done)
		}
		batch.decode(types.Registry, 1)()
		for _, c := range batch.chunks {
			for _, err := range c.errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}
