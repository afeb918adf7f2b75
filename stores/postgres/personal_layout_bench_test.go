package postgres_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkEnvelopeLayout measures what the sealed rows' envelope costs the
// server and the wire, before any opening, in the two layouts Projector
// stores: the envelope base64-encoded inside the jsonb payload
// (Personal.OneEnvelope), and apart (EnvelopeApart: the payload holding
// only the "pjx2." markers, the envelope's raw bytes in the bytea column
// beside it), each against the same events stored in the clear. It is the measurement behind issue 26's read ratio in
// docs/performance.md: the three tables are copies of 100-event streams a
// real store wrote, each read with the same one-stream statement on one
// connection, rows drained without scanning, in rotation so drift hits all
// three alike. Reported per event: the drained read's microseconds and
// bytes for each layout, and the ratio each sealed layout's read alone
// would leave against the clear one (plain ÷ sealed).
func BenchmarkEnvelopeLayout(b *testing.B) {
	ctx := context.Background()
	types := testevents.NewPersonal()
	pool := pgtest.Pool(b)
	schema := pgtest.Schema(b)
	_, plainStore := sealedAndPlainStores(b, pool, schema, types, masterKey(b, "bench", "bench"))
	// Written with the envelope inside the payload; the bytea table's rows
	// are moved apart from copies of them (moveEnvelopes).
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: inPayloadRegistry(), MasterKey: masterKey(b, "bench", "bench")})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		id := fmt.Sprintf("c-%d", i)
		name, email := "Ada Lovelace "+id, "ada."+id+"@example.com"
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := store.Append(ctx, tx, projector.Stream("customer", "read"), projector.AnyVersion,
				testevents.CustomerRegistered{Customer: id, Name: name, Email: email, Plan: "pro"}); err != nil {
				return err
			}
			_, err := plainStore.Append(ctx, tx, projector.Stream("plain", "read"), projector.AnyVersion,
				testevents.CustomerPlain{Customer: id, Name: name, Email: email, Plan: "pro"})
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}

	exec := func(sql string, args ...any) {
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	table := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	events := table("projector_events")
	exec(`CREATE TABLE ` + table("layout_plain") + ` AS SELECT * FROM ` + events + ` WHERE stream_type = 'plain'`)
	exec(`CREATE TABLE ` + table("layout_jsonb") + ` AS SELECT * FROM ` + events + ` WHERE stream_type = 'customer'`)
	exec(`CREATE TABLE ` + table("layout_bytea") + ` AS SELECT * FROM ` + events + ` WHERE stream_type = 'customer'`)
	moveEnvelopes(b, pool, table("layout_bytea"))
	for _, t := range []string{"layout_plain", "layout_jsonb", "layout_bytea"} {
		exec(`CREATE INDEX ON ` + table(t) + ` (tenant_id, stream_type, stream_id, version)`)
		exec(`ANALYZE ` + table(t))
	}

	const columns = `e.tx_id, e.seq, e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type,
	e.schema_version, e.data, e.correlation_id, e.causation_id, e.actor, e.headers, e.recorded_at`
	read := func(t, extra string) string {
		return `SELECT ` + columns + extra + ` FROM ` + table(t) + ` e
WHERE e.tenant_id = $1 AND e.stream_type = $2 AND e.stream_id = $3 ORDER BY e.version`
	}
	layouts := []struct {
		name, sql, streamType string
		took                  time.Duration
		bytes                 int
	}{
		{name: "plain", sql: read("layout_plain", ""), streamType: "plain"},
		{name: "jsonb", sql: read("layout_jsonb", ""), streamType: "customer"},
		{name: "bytea", sql: read("layout_bytea", ", e.envelope"), streamType: "customer"},
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	n := 0
	for b.Loop() {
		for i := range layouts {
			l := &layouts[i]
			start := time.Now()
			rows, err := conn.Query(ctx, l.sql, projector.SystemTenant, l.streamType, "read")
			if err != nil {
				b.Fatal(err)
			}
			count, size := 0, 0
			for rows.Next() {
				count++
				for _, v := range rows.RawValues() {
					size += len(v)
				}
			}
			if err := rows.Err(); err != nil || count != 100 {
				b.Fatalf("%s: %d rows, %v", l.name, count, err)
			}
			l.took += time.Since(start)
			l.bytes = size
		}
		n += 100
	}
	perEvent := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	for _, l := range layouts {
		b.ReportMetric(perEvent(l.took), l.name+"-µs/event")
		b.ReportMetric(float64(l.bytes)/100, l.name+"-bytes/event")
	}
	b.ReportMetric(layouts[0].took.Seconds()/layouts[1].took.Seconds(), "jsonb-ratio")
	b.ReportMetric(layouts[0].took.Seconds()/layouts[2].took.Seconds(), "bytea-ratio")
}

// moveEnvelopes rewrites each row of table as the bytea layout would store
// it: every sealed field of the payload left as the bare "pjx2." marker,
// the one envelope's bytes (base64-decoded) in the envelope column.
func moveEnvelopes(b *testing.B, pool *pgxpool.Pool, table string) {
	b.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT id, data FROM `+table)
	if err != nil {
		b.Fatal(err)
	}
	type moved struct {
		id       [16]byte
		data     []byte
		envelope []byte
	}
	var all []moved
	var m moved
	if _, err := pgx.ForEachRow(rows, []any{&m.id, &m.data}, func() error {
		var fields map[string]any
		if err := json.Unmarshal(m.data, &fields); err != nil {
			return err
		}
		var envelope []byte
		for k, v := range fields {
			s, ok := v.(string)
			if !ok || !strings.HasPrefix(s, "pjx2.") {
				continue
			}
			if len(s) > len("pjx2.") {
				if envelope, err = base64.RawURLEncoding.DecodeString(s[len("pjx2."):]); err != nil {
					return err
				}
			}
			fields[k] = "pjx2."
		}
		if envelope == nil {
			return fmt.Errorf("row %x holds no one-envelope seal: %s", m.id, m.data)
		}
		data, err := json.Marshal(fields)
		all = append(all, moved{id: m.id, data: data, envelope: envelope})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	for _, m := range all {
		if _, err := pool.Exec(ctx, `UPDATE `+table+` SET data = $2, envelope = $3 WHERE id = $1`, m.id, m.data, m.envelope); err != nil {
			b.Fatal(err)
		}
	}
}
