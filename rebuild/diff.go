package rebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Errors of Diff, besides ErrNotActive and ErrNotRebuildable.
var (
	// ErrNotReady: the rebuild has not caught up and stopped at ready
	// (held for a diff), so its shadow tables are still partial and a
	// comparison would only show what is not built yet.
	ErrNotReady = errors.New("rebuild: the rebuild is not ready")
	// ErrNoPrimaryKey: a declared table has no primary key, so rows of the
	// live and the shadow table cannot be matched.
	ErrNoPrimaryKey = errors.New("rebuild: table has no primary key")
	// ErrDiffLimit: the number of rows to show is out of range.
	ErrDiffLimit = errors.New("rebuild: diff limit out of range")
)

// Diff row limits: the default, and the most rows shown per table (the
// counts always cover every row).
const (
	DefaultDiffLimit = 10
	MaxDiffLimit     = 10_000
)

// Settling: how often Diff looks for a moment when the live and the shadow
// model are at the same position of the log, and how long it waits between
// looks (see Diff).
const (
	diffSettleTries = 20
	diffSettleWait  = 50 * time.Millisecond
)

// RowKind says how a row differs between the live and the shadow table.
type RowKind string

// The kinds of differing rows.
const (
	// Missing: the live table has the row, the shadow table does not; the
	// switch removes it from what readers see.
	Missing RowKind = "missing"
	// Extra: only the shadow table has the row; the switch adds it.
	Extra RowKind = "extra"
	// Changed: both have a row with this primary key, with different values
	// in Columns.
	Changed RowKind = "changed"
)

// Difference is what a switch would change: for each declared table, the
// live table beside the shadow one.
type Difference struct {
	// Rebuild is the ready rebuild whose shadow tables were compared.
	Rebuild Rebuild
	// LiveCursor and ShadowCursor are the positions the two models were
	// read at, in one snapshot.
	LiveCursor, ShadowCursor projector.Position
	// EventsBetween counts the events the projection handles between the
	// two cursors. Zero means both models reflect the same events, so every
	// difference comes from the new version's handlers; otherwise rows those
	// events touch may differ only because one model has them and the other
	// not yet (Diff tries for a second or so to avoid that while events are
	// being appended).
	EventsBetween int64
	// Tables has one comparison per declared table, in declaration order.
	Tables []TableDiff
}

// Same reports that no declared table differs.
func (d Difference) Same() bool {
	for _, t := range d.Tables {
		if !t.Same() {
			return false
		}
	}
	return true
}

// TableDiff compares one live table with its shadow copy.
type TableDiff struct {
	// Table is the live table and Shadow its copy, schema-qualified.
	Table  string `json:"table"`
	Shadow string `json:"shadow"`
	// Key is the primary key the rows are matched and ordered by.
	Key        []string `json:"key"`
	LiveRows   int64    `json:"live_rows"`
	ShadowRows int64    `json:"shadow_rows"`
	// Missing, Extra and Changed count every differing row.
	Missing int64 `json:"missing"`
	Extra   int64 `json:"extra"`
	Changed int64 `json:"changed"`
	// LiveOnlyColumns and ShadowOnlyColumns are columns one table has and
	// the other not (a new version that added or dropped a column); the rows
	// are compared on the columns both have.
	LiveOnlyColumns   []string `json:"live_only_columns,omitempty"`
	ShadowOnlyColumns []string `json:"shadow_only_columns,omitempty"`
	// Rows are the first differing rows by primary key, up to the limit.
	Rows []RowDiff `json:"rows"`
}

// Same reports that the tables hold the same rows.
func (t TableDiff) Same() bool {
	return t.Missing == 0 && t.Extra == 0 && t.Changed == 0 && len(t.LiveOnlyColumns) == 0 && len(t.ShadowOnlyColumns) == 0
}

// RowDiff is one differing row.
type RowDiff struct {
	Kind RowKind `json:"kind"`
	// Key holds the row's primary key values, in TableDiff.Key's order.
	Key []any `json:"key"`
	// Columns are the columns whose values differ, for Changed rows.
	Columns []string `json:"columns,omitempty"`
	// Live and Shadow are the rows as JSON objects (to_jsonb), nil where
	// the table lacks the row.
	Live   map[string]any `json:"live,omitempty"`
	Shadow map[string]any `json:"shadow,omitempty"`
}

// Diff compares the shadow tables of the projection's blue/green rebuild
// with the live tables, once the rebuild is ready: requested with Hold, it
// has caught up and waits for Switch. For each declared table it counts the
// rows of both and the rows that are missing from the shadow table, extra in
// it or changed, and returns the first limit of them (0: DefaultDiffLimit)
// by primary key, with the columns that differ. Rows are matched by a full
// join on the live table's primary key, values compared as to_jsonb (so
// columns of types without an equality operator, such as json, compare
// too).
//
// Both models keep moving while the rebuild is held (the live one serves,
// the shadow one keeps up), so Diff reads them in one repeatable-read
// snapshot, in which each model is exactly at its cursor, and looks for a
// snapshot in which no event the projection handles lies between the two
// cursors; while events arrive continuously it may not find one within about
// a second, and then compares what it has and says so in EventsBetween. It
// writes nothing and takes no lock a dispatcher waits for.
//
// It refuses with ErrNotActive without an active rebuild, ErrNotRebuildable
// for an in-place one (nothing to compare), ErrNotReady before the rebuild
// is ready and ErrNoPrimaryKey for a table without a primary key.
func Diff(ctx context.Context, store *postgres.Store, name string, limit int) (Difference, error) {
	if limit == 0 {
		limit = DefaultDiffLimit
	}
	if limit < 1 || limit > MaxDiffLimit {
		return Difference{}, fmt.Errorf("%w: %d rows: want 1 to %d", ErrDiffLimit, limit, MaxDiffLimit)
	}
	if !namePattern.MatchString(name) {
		return Difference{}, fmt.Errorf("%w: %s is not a projection name", ErrUnknownProjection, projector.Printable(name))
	}
	rb, err := readyRebuild(ctx, store, name)
	if err != nil {
		return Difference{}, err
	}
	var types []string
	if err := store.Pool().QueryRow(ctx, `SELECT event_types FROM `+store.Table("projector_projections")+` WHERE name = $1 AND version = $2`,
		name, rb.Version).Scan(&types); err != nil {
		return Difference{}, fmt.Errorf("rebuild diff %s: read its declaration: %w", name, err)
	}

	snap, err := settledSnapshot(ctx, store, name, types)
	if err != nil {
		return Difference{}, err
	}
	defer snap.close(ctx)
	out := Difference{Rebuild: rb, LiveCursor: snap.live, ShadowCursor: snap.shadow, EventsBetween: snap.between}
	for _, t := range rb.Tables {
		td, err := diffTable(ctx, snap.tx, name, t, rb.ShadowSchema, limit)
		if err != nil {
			return Difference{}, err
		}
		out.Tables = append(out.Tables, td)
	}
	return out, nil
}

// readyRebuild returns the projection's active rebuild if it can be
// compared, or says why not.
func readyRebuild(ctx context.Context, store *postgres.Store, name string) (Rebuild, error) {
	var id int64
	err := store.Pool().QueryRow(ctx, `SELECT id FROM `+store.Table("projector_rebuilds")+`
		WHERE name = $1 AND status IN ('building', 'ready')`, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Rebuild{}, fmt.Errorf("%w: %s; request one held for a diff with `projector rebuild %s --diff` (or --hold)", ErrNotActive, name, name)
	}
	if err != nil {
		return Rebuild{}, fmt.Errorf("rebuild diff %s: %w", name, err)
	}
	rb, err := get(ctx, store.Pool(), store, id)
	if err != nil {
		return Rebuild{}, err
	}
	switch {
	case rb.Mode == InPlace:
		return rb, fmt.Errorf("%w: %s is rebuilding in place: there are no shadow tables to compare", ErrNotRebuildable, name)
	case rb.Status == Building && !rb.Hold:
		return rb, fmt.Errorf("%w: rebuild %d of %s is building (%.0f%%) and switches on its own when it has caught up; to compare first, cancel it and request it again with --diff (or --hold)",
			ErrNotReady, rb.ID, name, 100*rb.Progress())
	case rb.Status == Building:
		return rb, fmt.Errorf("%w: rebuild %d of %s is still building (%.0f%%, %d events to go); its shadow tables can be compared once it is ready (`projector rebuild list %s`)",
			ErrNotReady, rb.ID, name, 100*rb.Progress(), rb.Remaining, name)
	}
	return rb, nil
}

// snapshot is a read-only repeatable-read transaction and the positions of
// the live and the shadow model in it.
type snapshot struct {
	tx           pgx.Tx
	live, shadow projector.Position
	between      int64
}

func (s *snapshot) close(ctx context.Context) { _ = s.tx.Rollback(context.WithoutCancel(ctx)) }

// settledSnapshot begins the snapshot the diff reads and looks for a moment
// when no event the projection handles lies between the two models' cursors,
// trying a few times. The cursors are read in the snapshot itself: a batch
// commits its tables and its cursor together, so in any snapshot each model
// is exactly at the cursor it shows there, and nothing needs locking.
func settledSnapshot(ctx context.Context, store *postgres.Store, name string, types []string) (*snapshot, error) {
	for try := 1; ; try++ {
		s, err := takeSnapshot(ctx, store, name, types)
		if err != nil || s.between == 0 || try == diffSettleTries {
			return s, err
		}
		s.close(ctx)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rebuild diff %s: %w", name, ctx.Err())
		case <-time.After(diffSettleWait):
		}
	}
}

func takeSnapshot(ctx context.Context, store *postgres.Store, name string, types []string) (*snapshot, error) {
	tx, err := store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("rebuild diff %s: %w", name, err)
	}
	s := &snapshot{tx: tx}
	err = tx.QueryRow(ctx, `SELECT l.cursor_tx_id, l.cursor_seq, s.cursor_tx_id, s.cursor_seq
		FROM `+store.Table("projector_consumers")+` l, `+store.Table("projector_consumers")+` s
		WHERE l.name = $1 AND l.instance_id = $2 AND s.name = $1 AND s.instance_id = $3`,
		name, projection.SharedInstance, projection.RebuildInstance).Scan(&s.live.TxID, &s.live.Seq, &s.shadow.TxID, &s.shadow.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("%w: %s: the rebuild switched or was cancelled meanwhile", ErrNotActive, name)
	} else if err != nil {
		err = fmt.Errorf("rebuild diff %s: read the cursors: %w", name, err)
	}
	if err == nil {
		lo, hi := s.live, s.shadow
		if hi.Less(lo) {
			lo, hi = hi, lo
		}
		if err = tx.QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_events")+`
			WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND (tx_id, seq) <= ($3::xid8, $4::bigint) AND type = ANY($5)`,
			lo.TxID, lo.Seq, hi.TxID, hi.Seq, types).Scan(&s.between); err != nil {
			err = fmt.Errorf("rebuild diff %s: count the events between the cursors: %w", name, err)
		}
	}
	if err != nil {
		s.close(ctx)
		return nil, err
	}
	return s, nil
}

// diffTable compares the live table t with its copy in the shadow schema,
// in the snapshot's transaction.
func diffTable(ctx context.Context, tx pgx.Tx, name, t, shadowSchema string, limit int) (TableDiff, error) {
	_, rel, _ := strings.Cut(t, ".")
	live, shadow := qualified(t), pgx.Identifier{shadowSchema, rel}.Sanitize()
	td := TableDiff{Table: t, Shadow: shadowSchema + "." + rel, Rows: []RowDiff{}}
	key, err := primaryKey(ctx, tx, live)
	if err != nil {
		return td, fmt.Errorf("rebuild diff %s: table %s: %w", name, t, err)
	}
	if len(key) == 0 {
		return td, fmt.Errorf("%w: %s: the diff matches rows of the live and the shadow table by primary key; add one (ALTER TABLE %s ADD PRIMARY KEY (...)) or compare by hand",
			ErrNoPrimaryKey, t, live)
	}
	td.Key = key
	liveCols, err := columns(ctx, tx, live)
	if err != nil {
		return td, fmt.Errorf("rebuild diff %s: table %s: %w", name, t, err)
	}
	shadowCols, err := columns(ctx, tx, shadow)
	if err != nil {
		return td, fmt.Errorf("rebuild diff %s: table %s: %w", name, td.Shadow, err)
	}
	var common []string
	for _, c := range liveCols {
		switch {
		case !slices.Contains(shadowCols, c):
			td.LiveOnlyColumns = append(td.LiveOnlyColumns, c)
		case !slices.Contains(key, c):
			common = append(common, c)
		}
	}
	for _, c := range shadowCols {
		if !slices.Contains(liveCols, c) {
			td.ShadowOnlyColumns = append(td.ShadowOnlyColumns, c)
		}
	}
	for _, k := range key {
		if !slices.Contains(shadowCols, k) {
			return td, fmt.Errorf("%w: the shadow table %s lacks the live table's primary key column %s", ErrNoPrimaryKey, td.Shadow, k)
		}
	}

	q := diffQueries(live, shadow, key, common)
	if err := tx.QueryRow(ctx, q.counts, common).Scan(&td.LiveRows, &td.ShadowRows, &td.Missing, &td.Extra, &td.Changed); err != nil {
		return td, fmt.Errorf("rebuild diff %s: count the differences of %s: %w", name, t, err)
	}
	rows, err := tx.Query(ctx, q.rows, common, limit)
	if err != nil {
		return td, fmt.Errorf("rebuild diff %s: read the differences of %s: %w", name, t, err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var keyJSON, liveJSON, shadowJSON []byte
		var r RowDiff
		if err := rows.Scan(&kind, &keyJSON, &r.Columns, &liveJSON, &shadowJSON); err != nil {
			return td, fmt.Errorf("rebuild diff %s: read the differences of %s: %w", name, t, err)
		}
		r.Kind = RowKind(kind)
		if err := decodeJSON(keyJSON, &r.Key); err != nil {
			return td, fmt.Errorf("rebuild diff %s: key of %s: %w", name, t, err)
		}
		if err := decodeJSON(liveJSON, &r.Live); err != nil {
			return td, fmt.Errorf("rebuild diff %s: row of %s: %w", name, t, err)
		}
		if err := decodeJSON(shadowJSON, &r.Shadow); err != nil {
			return td, fmt.Errorf("rebuild diff %s: row of %s: %w", name, td.Shadow, err)
		}
		td.Rows = append(td.Rows, r)
	}
	if err := rows.Err(); err != nil {
		return td, fmt.Errorf("rebuild diff %s: read the differences of %s: %w", name, t, err)
	}
	return td, nil
}

// decodeJSON keeps numbers as json.Number, so a bigint key or a numeric
// value is shown as stored, not rounded through float64.
func decodeJSON(b []byte, v any) error {
	if b == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

type diffSQL struct{ counts, rows string }

// diffQueries builds the two statements that compare live (alias l) with
// shadow (alias s): a full join on the primary key, so a row on one side
// only shows as a NULL key on the other. Non-key columns compare as
// to_jsonb, which every type has (json has no equality operator); $1 holds
// their names, so no name is spliced into the SQL as a literal (the
// always-true cardinality test keeps $1 in both statements when the table has
// no column besides its key).
func diffQueries(live, shadow string, key, common []string) diffSQL {
	k0 := pgx.Identifier{key[0]}.Sanitize()
	var on, order, keyValues []string
	for _, k := range key {
		c := pgx.Identifier{k}.Sanitize()
		on = append(on, "l."+c+" = s."+c)
		order = append(order, "coalesce(l."+c+", s."+c+")")
		keyValues = append(keyValues, "coalesce(l."+c+", s."+c+")")
	}
	var lv, sv, changedCols []string
	for i, col := range common {
		c := pgx.Identifier{col}.Sanitize()
		lv, sv = append(lv, "to_jsonb(l."+c+")"), append(sv, "to_jsonb(s."+c+")")
		changedCols = append(changedCols, fmt.Sprintf("CASE WHEN to_jsonb(l.%s) IS DISTINCT FROM to_jsonb(s.%s) THEN ($1::text[])[%d] END", c, c, i+1))
	}
	valuesDiffer := "false"
	columnsExpr := "'{}'::text[]"
	if len(common) > 0 {
		valuesDiffer = "ROW(" + strings.Join(lv, ", ") + ") IS DISTINCT FROM ROW(" + strings.Join(sv, ", ") + ")"
		columnsExpr = "array_remove(ARRAY[" + strings.Join(changedCols, ", ") + "]::text[], NULL)"
	}
	from := ` FROM ` + live + ` l FULL JOIN ` + shadow + ` s ON ` + strings.Join(on, " AND ") + `
		WHERE (l.` + k0 + ` IS NULL OR s.` + k0 + ` IS NULL OR ` + valuesDiffer + `) AND cardinality($1::text[]) >= 0`
	return diffSQL{
		counts: `SELECT (SELECT count(*) FROM ` + live + `), (SELECT count(*) FROM ` + shadow + `),
			count(*) FILTER (WHERE s.` + k0 + ` IS NULL), count(*) FILTER (WHERE l.` + k0 + ` IS NULL),
			count(*) FILTER (WHERE l.` + k0 + ` IS NOT NULL AND s.` + k0 + ` IS NOT NULL)` + from,
		rows: `SELECT CASE WHEN l.` + k0 + ` IS NULL THEN 'extra' WHEN s.` + k0 + ` IS NULL THEN 'missing' ELSE 'changed' END,
			jsonb_build_array(` + strings.Join(keyValues, ", ") + `),
			CASE WHEN l.` + k0 + ` IS NOT NULL AND s.` + k0 + ` IS NOT NULL THEN ` + columnsExpr + ` ELSE '{}'::text[] END,
			CASE WHEN l.` + k0 + ` IS NOT NULL THEN to_jsonb(l) END,
			CASE WHEN s.` + k0 + ` IS NOT NULL THEN to_jsonb(s) END` + from + `
		ORDER BY ` + strings.Join(order, ", ") + ` LIMIT $2`,
	}
}

// primaryKey returns the primary key columns of table, in key order.
func primaryKey(ctx context.Context, tx pgx.Tx, table string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT a.attname FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY k.ord`, table)
	if err != nil {
		return nil, fmt.Errorf("read the primary key: %w", err)
	}
	key, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the primary key: %w", err)
	}
	return key, nil
}

// columns returns table's columns in their order.
func columns(ctx context.Context, tx pgx.Tx, table string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table)
	if err != nil {
		return nil, fmt.Errorf("read the columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the columns: %w", err)
	}
	return cols, nil
}
