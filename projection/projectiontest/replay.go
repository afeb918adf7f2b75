package projectiontest

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ReplayConfig configures [ReplayTest].
type ReplayConfig struct {
	// Store is the database the replay runs in, in a transaction rolled
	// back at the end, as a [Spec]'s. The read-model tables must exist.
	Store *postgres.Store
	// Tables are the read-model tables compared, each with a primary key
	// (rows are matched by it), as the projection's queries name them.
	// The golden file keys its rows by these names as written, schema
	// included: name them alike on every run (a golden file's table that
	// Tables does not name fails the test).
	Tables []string
	// Golden is the file holding the model the old version of the
	// projection built from the same history: one JSON object per row.
	Golden string
	// Update writes Golden from this run instead of comparing: run it once
	// with the version in production (wire it to a flag of your tests, as
	// `go test -run Replay -update`), commit the file, and every later run
	// compares the projection's new versions with it.
	Update bool
	// BatchSize is the number of events applied per batch, as a
	// dispatcher pass would receive them; default 1000.
	BatchSize int
	// Limit is the most differing rows printed per table; default 20
	// (the counts cover every row).
	Limit int
}

// ReplayResult is what a replay found.
type ReplayResult struct {
	// Events counts the events replayed.
	Events int
	// Rows counts the rows of the model built.
	Rows int
	// Differences are the differing rows, of every table, up to Limit
	// per table.
	Differences []RowDifference
	// Counts are the differing rows per table, all of them.
	Counts map[string]int
}

// RowDifference is one row in which the replayed model differs from the
// golden one. Kind is "missing" (only the golden model has it), "extra"
// (only the replay) or "changed" (Columns differ), as `rebuild --diff`
// says of a shadow table beside the live one.
type RowDifference struct {
	Table   string
	Key     string // the primary key's values, as JSON
	Kind    string
	Columns []string
	Golden  map[string]any
	Replay  map[string]any
}

func (d RowDifference) String() string {
	switch d.Kind {
	case "changed":
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s changed:", d.Table, d.Key)
		for _, c := range d.Columns {
			g, _ := json.Marshal(d.Golden[c])
			r, _ := json.Marshal(d.Replay[c])
			fmt.Fprintf(&b, " %s %s → %s;", c, g, r)
		}
		return strings.TrimSuffix(b.String(), ";")
	case "missing":
		g, _ := json.Marshal(d.Golden)
		return fmt.Sprintf("%s %s missing from the replay (golden %s)", d.Table, d.Key, g)
	default:
		r, _ := json.Marshal(d.Replay)
		return fmt.Sprintf("%s %s extra in the replay (%s)", d.Table, d.Key, r)
	}
}

// ReplayTest runs projection p over the events of a history file (what
// `projector events export` writes, anonymised with --redact where it
// holds personal data), through the production apply path as [Spec] does,
// and compares the model it builds, table by table and row by row, with
// the model the old version built (cfg.Golden). A projection change that
// would alter what a rebuild writes in production fails the test, naming
// every differing row (up to cfg.Limit per table) and the columns that
// differ, before any rebuild runs. With cfg.Update it writes the golden
// file instead.
func ReplayTest(t testing.TB, file string, p *projection.Async, cfg ReplayConfig) ReplayResult {
	t.Helper()
	if cfg.Golden == "" || len(cfg.Tables) == 0 {
		t.Fatalf("projectiontest: ReplayConfig needs Golden and Tables")
	}
	spec := New(t, Config{Store: cfg.Store, Async: p})
	res := ReplayResult{Counts: map[string]int{}}
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("projectiontest: replay: %v", err)
	}
	defer f.Close()
	dec := postgres.NewHistoryDecoder(f)
	size := cmp.Or(cfg.BatchSize, 1000)
	batch := make([]postgres.HistoryEvent, 0, size)
	apply := func() {
		if len(batch) == 0 {
			return
		}
		spec.add(spec.ev.fromEvents(toEvents(batch)))
		batch = batch[:0]
		if err := spec.applyPending(); err != nil {
			t.Fatalf("projectiontest: replay of %s: %v", file, err)
		}
		spec.eventLog.applied = spec.eventLog.applied[:0] // replays are long; failures name rows, not events
	}
	for {
		var h postgres.HistoryEvent
		err := dec.Next(&h)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("projectiontest: replay %s: %v", file, err)
		}
		batch = append(batch, h)
		res.Events++
		if len(batch) == size {
			apply()
		}
	}
	apply()

	model, err := readModel(spec, cfg.Tables)
	if err != nil {
		t.Fatalf("projectiontest: replay: read the model: %v", err)
	}
	// Rolled back now, not when the test ends: a second replay in the same
	// test writes the same keys and would wait for this transaction.
	if err := spec.tx.Rollback(spec.ctx); err != nil {
		t.Fatalf("projectiontest: replay: roll back: %v", err)
	}
	for _, rows := range model {
		res.Rows += len(rows)
	}
	if cfg.Update {
		if err := writeGolden(cfg.Golden, cfg.Tables, model); err != nil {
			t.Fatalf("projectiontest: replay: write %s: %v", cfg.Golden, err)
		}
		t.Logf("projectiontest: wrote %s: %d rows built from %d events", cfg.Golden, res.Rows, res.Events)
		return res
	}
	golden, err := readGolden(cfg.Golden)
	if err != nil {
		t.Fatalf("projectiontest: replay: %v (record it with ReplayConfig.Update, running the version in production)", err)
	}
	// A table of the golden file that Tables does not name would be
	// compared with nothing: recorded under another schema or spelling,
	// its rows would read as extra in the replay, or, the table given
	// being empty, the test would pass having compared nothing.
	var unnamed []string
	for table := range golden {
		if !slices.Contains(cfg.Tables, table) {
			unnamed = append(unnamed, table)
		}
	}
	if len(unnamed) > 0 {
		slices.Sort(unnamed)
		t.Errorf("projectiontest: replay: %s holds the rows of %s, which ReplayConfig.Tables (%s) does not name: "+
			"name the tables as when the golden file was recorded (same schema, same spelling), or record the golden file again with ReplayConfig.Update",
			cfg.Golden, strings.Join(unnamed, ", "), strings.Join(cfg.Tables, ", "))
	}
	limit := cmp.Or(cfg.Limit, 20)
	for _, table := range cfg.Tables {
		diffs := compareRows(table, golden[table], model[table])
		res.Counts[table] = len(diffs)
		res.Differences = append(res.Differences, diffs[:min(len(diffs), limit)]...)
	}
	if len(res.Differences) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "projectiontest: replaying %s (%d events), %s builds a model that differs from %s:", file, res.Events, p.Name(), cfg.Golden)
		for _, table := range cfg.Tables {
			if n := res.Counts[table]; n > 0 {
				fmt.Fprintf(&b, "\n%s: %d %s differ", table, n, map[bool]string{true: "row", false: "rows"}[n == 1])
			}
		}
		for _, d := range res.Differences {
			b.WriteString("\n  " + d.String())
		}
		t.Errorf("%s", b.String())
	}
	return res
}

// toEvents turns history lines into events as stored, which the kit
// decodes as a dispatcher would.
func toEvents(hs []postgres.HistoryEvent) []projector.Event {
	out := make([]projector.Event, len(hs))
	for i, h := range hs {
		out[i] = h.Event()
	}
	return out
}

// modelRow is one row of a read model: its key as JSON and the row as a
// JSON object.
type modelRow struct {
	Key string
	Row map[string]any
}

// readModel reads every row of the tables in the spec's transaction,
// ordered by primary key.
func readModel(s *Spec, tables []string) (map[string][]modelRow, error) {
	out := map[string][]modelRow{}
	for _, table := range tables {
		key, err := primaryKey(s, table)
		if err != nil {
			return nil, err
		}
		ids := make([]string, len(key))
		for i, k := range key {
			ids[i] = "t." + pgx.Identifier{k}.Sanitize()
		}
		rows, err := s.tx.Query(s.ctx, `SELECT jsonb_build_array(`+strings.Join(ids, ", ")+`)::text, to_jsonb(t)::text FROM `+table+` t ORDER BY `+strings.Join(ids, ", "))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
		var k, row string
		_, err = pgx.ForEachRow(rows, []any{&k, &row}, func() error {
			var m map[string]any
			if err := json.Unmarshal([]byte(row), &m); err != nil {
				return err
			}
			out[table] = append(out[table], modelRow{Key: k, Row: m})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
	}
	return out, nil
}

// primaryKey returns the columns of table's primary key, in order.
func primaryKey(s *Spec, table string) ([]string, error) {
	rows, err := s.tx.Query(s.ctx, `SELECT a.attname FROM pg_index i
		JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY k.ord`, table)
	if err != nil {
		return nil, fmt.Errorf("primary key of %s: %w", table, err)
	}
	key, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("primary key of %s: %w", table, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("table %s has no primary key: replay tests match rows by it", table)
	}
	return key, nil
}

// goldenLine is one row of a golden file.
type goldenLine struct {
	Table string          `json:"table"`
	Key   json.RawMessage `json:"key"`
	Row   map[string]any  `json:"row"`
}

// writeGolden writes the model as JSON Lines, table by table in the given
// order, rows by key: a stable file that diffs well in review.
func writeGolden(path string, tables []string, model map[string][]modelRow) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	for _, table := range tables {
		for _, r := range model[table] {
			if err := enc.Encode(goldenLine{Table: table, Key: json.RawMessage(r.Key), Row: r.Row}); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func readGolden(path string) (map[string][]modelRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]modelRow{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for n := 1; sc.Scan(); n++ {
		var l goldenLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		// The key as PostgreSQL prints it, so both sides compare alike.
		var k any
		if err := json.Unmarshal(l.Key, &k); err != nil {
			return nil, fmt.Errorf("%s line %d: key: %w", path, n, err)
		}
		out[l.Table] = append(out[l.Table], modelRow{Key: canonical(k), Row: l.Row})
	}
	return out, sc.Err()
}

// canonical prints a JSON value the way both sides of a comparison are
// printed.
func canonical(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// compareRows matches golden and replayed rows by key.
func compareRows(table string, golden, replay []modelRow) []RowDifference {
	g := make(map[string]map[string]any, len(golden))
	for _, r := range golden {
		g[canonicalKey(r.Key)] = r.Row
	}
	var out []RowDifference
	seen := make(map[string]bool, len(replay))
	for _, r := range replay {
		k := canonicalKey(r.Key)
		seen[k] = true
		old, ok := g[k]
		if !ok {
			out = append(out, RowDifference{Table: table, Key: k, Kind: "extra", Replay: r.Row})
			continue
		}
		var cols []string
		for c := range mergedKeys(old, r.Row) {
			if canonical(old[c]) != canonical(r.Row[c]) {
				cols = append(cols, c)
			}
		}
		if len(cols) > 0 {
			slices.Sort(cols)
			out = append(out, RowDifference{Table: table, Key: k, Kind: "changed", Columns: cols, Golden: old, Replay: r.Row})
		}
	}
	for _, r := range golden {
		if k := canonicalKey(r.Key); !seen[k] {
			out = append(out, RowDifference{Table: table, Key: k, Kind: "missing", Golden: r.Row})
		}
	}
	slices.SortFunc(out, func(a, b RowDifference) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func canonicalKey(k string) string {
	var v any
	if err := json.Unmarshal([]byte(k), &v); err != nil {
		return k
	}
	return canonical(v)
}

func mergedKeys(a, b map[string]any) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
