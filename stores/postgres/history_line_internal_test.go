package postgres

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
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
		if ref, version, ok := prescanHistoryLine(line); !ok || ref != h.Stream.Ref() || version != h.Version {
			t.Fatalf("prescan of %s: %s version %d, %v", line, ref, version, ok)
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
		if ref, version, pre := prescanHistoryLine(line); pre && ok && (ref != fast.Stream.Ref() || version != fast.Version) {
			t.Fatalf("prescan read %q as %s version %d, the fast path as %s version %d", line, ref, version, fast.Stream.Ref(), fast.Version)
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
