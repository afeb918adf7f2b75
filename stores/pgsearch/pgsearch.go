// Package pgsearch is the embedded default search backend: each index is a
// table of the application's database, written in the dispatcher's
// transaction, searched with PostgreSQL full-text search.
//
// The table of index NAME is projector_search_NAME in the store's schema:
//
//   - tenant_id, id (the primary key) and doc, the document as jsonb;
//   - search_text, a generated tsvector over the searchable attributes
//     (weighted A, B, C, D in the order declared; the whole document's
//     strings when none are declared), with a GIN index;
//   - for each filterable attribute a, a generated jsonb column "f_a" with a
//     GIN index, compared by containment so an array attribute matches any
//     of its elements, as Meilisearch filters do.
//
// Because the writes commit with the consumer's cursor, indexing is exactly
// once (promise 5), not merely at least once. The table is created, and its
// generated columns replaced when the settings change, by [Backend.Ensure].
package pgsearch

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/postgres"
)

// DefaultTextSearchConfig is the text search configuration used when
// [Config] names none: it lower-cases words without stemming or stop words,
// which suits names, titles and codes in any language.
const DefaultTextSearchConfig = "simple"

// Config configures the backend.
type Config struct {
	// TextSearchConfig is the PostgreSQL text search configuration
	// ("english", "german", ...), default [DefaultTextSearchConfig].
	TextSearchConfig string
}

// ErrUnbound: the backend was made with [NewForSchema] and not yet given a
// database ([Backend.Bind]) when something other than the dispatcher's
// writes needed one.
var ErrUnbound = errors.New("pgsearch: no database bound (use pgsearch.New with a store, or Backend.Bind)")

// Backend keeps search indexes in tables of a store's database.
type Backend struct {
	schema string
	cfg    Config
	mu     sync.Mutex
	db     postgres.DB
}

var configPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// New returns a backend keeping its tables in store's schema, using the
// store's pool for Ensure, searches and listings.
func New(store *postgres.Store, cfg Config) (*Backend, error) {
	if store == nil {
		return nil, errors.New("pgsearch: nil store")
	}
	b, err := NewForSchema(store.Schema(), cfg)
	if err != nil {
		return nil, err
	}
	b.db = store.Pool()
	return b, nil
}

// NewForSchema returns a backend keeping its tables in schema with no
// database yet: for applications that build their projections from the
// schema name before a pool exists (cli.Config.Wire). The dispatcher's
// writes need none (they go through its transaction); Ensure, searches
// and listings need one: call [Backend.Bind], or run [Backend.EnsureOn]
// from the application's setup step.
func NewForSchema(schema string, cfg Config) (*Backend, error) {
	cfg.TextSearchConfig = cmp.Or(cfg.TextSearchConfig, DefaultTextSearchConfig)
	if !configPattern.MatchString(cfg.TextSearchConfig) {
		return nil, fmt.Errorf("pgsearch: text search configuration %q: want a lower-case identifier", cfg.TextSearchConfig)
	}
	if schema == "" {
		return nil, errors.New("pgsearch: empty schema")
	}
	return &Backend{schema: schema, cfg: cfg}, nil
}

// Bind gives a backend made with [NewForSchema] its database, unless it
// has one already. It returns b.
func (b *Backend) Bind(db postgres.DB) *Backend {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.db == nil {
		b.db = db
	}
	return b
}

// BindDB is [Backend.Bind] for search.Verify, which binds backends that
// live in the store's database to the store's pool.
func (b *Backend) BindDB(db postgres.DB) { b.Bind(db) }

func (b *Backend) database() (postgres.DB, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.db == nil {
		return nil, ErrUnbound
	}
	return b.db, nil
}

// Kind names the backend.
func (b *Backend) Kind() string { return "pgsearch" }

// TableName returns the unqualified table name of idx.
func TableName(idx search.Index) string { return "projector_search_" + idx.Name }

// Tables declares the index's table, schema-qualified, for the consumer
// (projection.AsyncConfig.Tables), so a rebuild can clear or shadow it.
func (b *Backend) Tables(idx search.Index) []string {
	return []string{b.schema + "." + TableName(idx)}
}

func (b *Backend) table(idx search.Index) string {
	return pgx.Identifier{b.schema, TableName(idx)}.Sanitize()
}

// filterColumn is the generated column of filterable attribute a.
func filterColumn(a string) string { return pgx.Identifier{"f_" + a}.Sanitize() }

// settings is what the table's generated columns were made from, kept as
// the comment of its search_text column so Ensure can tell when they must
// be remade. A column's comment, unlike the table's, is copied by CREATE
// TABLE … (LIKE … INCLUDING ALL), so it survives a blue/green rebuild's
// switch to the shadow copy.
type settings struct {
	Config     string   `json:"config"`
	Searchable []string `json:"searchable"`
	Filterable []string `json:"filterable"`
}

// Ensure creates idx's table if missing and, when the searchable or
// filterable attributes (or the text search configuration) changed since
// it was made, replaces the generated columns and their indexes. It runs
// under an advisory lock, so processes starting together do not race.
func (b *Backend) Ensure(ctx context.Context, idx search.Index) error {
	db, err := b.database()
	if err != nil {
		return err
	}
	return b.EnsureOn(ctx, db, idx)
}

// EnsureOn is [Backend.Ensure] through db: in a transaction of its own
// when db can begin one (a pool, a connection), else in db's (the
// application's setup step, cli.Wiring.Setup).
func (b *Backend) EnsureOn(ctx context.Context, db postgres.DBTX, idx search.Index) error {
	if err := idx.Validate(); err != nil {
		return err
	}
	if idx.PrimaryKey == "" {
		idx.PrimaryKey = search.DefaultPrimaryKey
	}
	want, err := json.Marshal(settings{Config: b.cfg.TextSearchConfig, Searchable: nonNil(idx.Searchable), Filterable: nonNil(idx.Filterable)})
	if err != nil {
		return err
	}
	t := b.table(idx)
	if beginner, ok := db.(postgres.DB); ok {
		return pgx.BeginFunc(ctx, beginner, func(tx pgx.Tx) error { return b.ensure(ctx, tx, idx, t, want) })
	}
	return b.ensure(ctx, db, idx, t, want)
}

func (b *Backend) ensure(ctx context.Context, tx postgres.DBTX, idx search.Index, t string, want []byte) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "projector_search:"+t); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
			tenant_id text NOT NULL,
			id text NOT NULL,
			doc jsonb NOT NULL,
			PRIMARY KEY (tenant_id, id))`); err != nil {
		return fmt.Errorf("create table %s: %w", t, err)
	}
	var have *string
	if err := tx.QueryRow(ctx, `SELECT col_description(attrelid, attnum) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = 'search_text' AND NOT attisdropped`, t).Scan(&have); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read settings of %s: %w", t, err)
	}
	if have != nil && *have == string(want) {
		return nil
	}
	var cols []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(attname::text), '{}') FROM pg_attribute
			WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attname NOT IN ('tenant_id', 'id', 'doc')`, t).Scan(&cols); err != nil {
		return fmt.Errorf("read columns of %s: %w", t, err)
	}
	for _, c := range cols {
		if _, err := tx.Exec(ctx, `ALTER TABLE `+t+` DROP COLUMN `+pgx.Identifier{c}.Sanitize()); err != nil {
			return fmt.Errorf("drop old column %s of %s: %w", c, t, err)
		}
	}
	cfg := quoteLiteral(b.cfg.TextSearchConfig) + "::regconfig"
	if _, err := tx.Exec(ctx, `ALTER TABLE `+t+` ADD COLUMN search_text tsvector GENERATED ALWAYS AS (`+vectorExpr(cfg, idx.Searchable)+`) STORED`); err != nil {
		return fmt.Errorf("add the search column to %s (text search configuration %q): %w", t, b.cfg.TextSearchConfig, err)
	}
	if _, err := tx.Exec(ctx, `CREATE INDEX `+indexName(t, "search_text")+` ON `+t+` USING gin (search_text)`); err != nil {
		return fmt.Errorf("index the search column of %s: %w", t, err)
	}
	for _, a := range idx.Filterable {
		col := filterColumn(a)
		if _, err := tx.Exec(ctx, `ALTER TABLE `+t+` ADD COLUMN `+col+` jsonb GENERATED ALWAYS AS (doc -> `+quoteLiteral(a)+`) STORED`); err != nil {
			return fmt.Errorf("add filter column %s to %s: %w", col, t, err)
		}
		if _, err := tx.Exec(ctx, `CREATE INDEX `+indexName(t, col)+` ON `+t+` USING gin (`+col+`)`); err != nil {
			return fmt.Errorf("index filter column %s of %s: %w", col, t, err)
		}
	}
	if _, err := tx.Exec(ctx, `COMMENT ON COLUMN `+t+`.search_text IS `+quoteLiteral(string(want))); err != nil {
		return fmt.Errorf("record settings of %s: %w", t, err)
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// vectorExpr is the generated tsvector: the searchable attributes weighted
// by their order, or every string of the document.
func vectorExpr(cfg string, searchable []string) string {
	if len(searchable) == 0 {
		return `jsonb_to_tsvector(` + cfg + `, doc, '["string"]')`
	}
	parts := make([]string, len(searchable))
	for i, a := range searchable {
		weight := "ABCD"[min(i, 3)]
		parts[i] = `setweight(coalesce(jsonb_to_tsvector(` + cfg + `, doc -> ` + quoteLiteral(a) + `, '["string"]'), ''::tsvector), '` + string(weight) + `')`
	}
	return strings.Join(parts, " || ")
}

// indexName is a short, stable name for an index of table t on col: a
// hash, because t and col together may pass PostgreSQL's 63 bytes.
func indexName(t, col string) string {
	h := sha256.Sum256([]byte(t + "\x00" + col))
	return pgx.Identifier{"projector_search_" + hex.EncodeToString(h[:8])}.Sanitize()
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// GrantTenantRole lets role, the store's postgres.Config.TenantRole, write
// idx's table from tenant-scoped handlers, and puts row-level security on
// it as postgres.GrantTenantRole does on Projector's tables: a permissive
// policy for every role (unscoped work, searches through the pool) and a
// restrictive one for role keyed on the tenant setting, so a handler
// scoped to one tenant can neither see nor write another's documents —
// enforced by PostgreSQL. Run it as the table's owner after Ensure, like
// postgres.GrantTenantRole, at deploy time; it is idempotent.
func (b *Backend) GrantTenantRole(ctx context.Context, db postgres.DBTX, idx search.Index, role string) error {
	if role == "" {
		return errors.New("pgsearch: grant tenant role: empty role name")
	}
	if err := idx.Validate(); err != nil {
		return err
	}
	t, r := b.table(idx), pgx.Identifier{role}.Sanitize()
	policy := pgx.Identifier{tenantPolicyName(role)}.Sanitize()
	match := `tenant_id = current_setting('` + postgres.TenantSetting + `', true)`
	// One simple-protocol query, one transaction: no moment with row-level
	// security on and a policy missing.
	sql := `GRANT SELECT, INSERT, UPDATE, DELETE ON ` + t + ` TO ` + r + `;
ALTER TABLE ` + t + ` ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS projector_unscoped ON ` + t + `;
CREATE POLICY projector_unscoped ON ` + t + ` USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS ` + policy + ` ON ` + t + `;
CREATE POLICY ` + policy + ` ON ` + t + ` AS RESTRICTIVE TO ` + r + ` USING (` + match + `) WITH CHECK (` + match + `);`
	if _, err := db.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("pgsearch: grant tenant role %s on %s: %w", r, t, err)
	}
	return nil
}

// tenantPolicyName names role's restrictive policy, hashed when it would
// not fit PostgreSQL's 63 bytes.
func tenantPolicyName(role string) string {
	const prefix = "projector_tenant_"
	if len(prefix)+len(role) <= 63 {
		return prefix + role
	}
	sum := sha256.Sum256([]byte(role))
	return prefix + hex.EncodeToString(sum[:16])
}

// Apply writes ops through the dispatcher's transaction, pipelined in one
// round trip: each run of consecutive operations of one kind and tenant
// becomes one statement (an unnest upsert, one delete of many ids).
func (b *Backend) Apply(ctx context.Context, tx pgx.Tx, idx search.Index, ops []search.Op) error {
	t := projection.Table(ctx, b.schema+"."+TableName(idx))
	batch := &pgx.Batch{}
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && ops[j].Kind == ops[i].Kind && ops[j].Tenant == ops[i].Tenant && ops[i].Kind != search.OpDeleteWhere {
			j++
		}
		if err := queueRun(batch, t, ops[i:j]); err != nil {
			return err
		}
		i = j
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("write index table %s: %w", t, err)
	}
	return nil
}

// queueRun queues one statement for a run of operations of one kind and
// tenant.
func queueRun(batch *pgx.Batch, t string, run []search.Op) error {
	tenant := run[0].Tenant
	switch run[0].Kind {
	case search.OpUpsert, search.OpPatch:
		// One row per id: INSERT … ON CONFLICT may not touch a row twice.
		// Upserts keep the last document, patches merge in order.
		// An id touched once (the usual case) is written with the JSON the
		// handler's document was encoded to (Op.Raw), not encoded again;
		// only ids touched several times are merged and encoded here.
		order, first, merged := []string{}, map[string]int{}, map[string]map[string]json.RawMessage{}
		for i, op := range run {
			j, seen := first[op.ID]
			if !seen {
				first[op.ID] = i
				order = append(order, op.ID)
				continue
			}
			d := merged[op.ID]
			if d == nil || op.Kind == search.OpUpsert {
				d = map[string]json.RawMessage{}
				if op.Kind == search.OpPatch {
					maps.Copy(d, run[j].Doc)
				}
			}
			maps.Copy(d, op.Doc)
			merged[op.ID] = d
		}
		bodies := make([]string, len(order))
		for i, id := range order {
			doc, raw := merged[id], json.RawMessage(nil)
			if doc == nil {
				doc, raw = run[first[id]].Doc, run[first[id]].Raw
			}
			if raw == nil {
				var err error
				if raw, err = json.Marshal(doc); err != nil {
					return fmt.Errorf("encode document %q: %w", id, err)
				}
			}
			bodies[i] = string(raw)
		}
		set := `doc = EXCLUDED.doc`
		if run[0].Kind == search.OpPatch {
			set = `doc = d.doc || EXCLUDED.doc`
		}
		batch.Queue(`INSERT INTO `+t+` AS d (tenant_id, id, doc)
			SELECT $1, u.id, u.doc::jsonb FROM unnest($2::text[], $3::text[]) AS u(id, doc)
			ON CONFLICT (tenant_id, id) DO UPDATE SET `+set, tenant, order, bodies)
	case search.OpDelete:
		ids := make([]string, len(run))
		for i, op := range run {
			ids[i] = op.ID
		}
		batch.Queue(`DELETE FROM `+t+` WHERE tenant_id = $1 AND id = ANY($2::text[])`, tenant, ids)
	case search.OpDeleteWhere:
		where, args, err := filterSQL(run[0].Filters, []any{tenant})
		if err != nil {
			return err
		}
		batch.Queue(`DELETE FROM `+t+` WHERE tenant_id = $1`+where, args...)
	default:
		return fmt.Errorf("unknown operation %v", run[0].Kind)
	}
	return nil
}

// filterSQL renders filters as " AND f_a @> $n::jsonb …", appending their
// values to args.
func filterSQL(filters []search.Filter, args []any) (string, []any, error) {
	var sb strings.Builder
	for _, f := range filters {
		v, err := f.JSON()
		if err != nil {
			return "", nil, err
		}
		args = append(args, string(v))
		fmt.Fprintf(&sb, " AND %s @> $%d::jsonb", filterColumn(f.Attr), len(args))
	}
	return sb.String(), args, nil
}

// Query searches idx's table: the words of q.Text as prefixes (every word
// must match, as in Meilisearch's default), ranked by ts_rank, or ordered
// by q.Sort; only q.Tenant's documents in a tenant-owned index.
func (b *Backend) Query(ctx context.Context, idx search.Index, q search.Request) ([]json.RawMessage, error) {
	t := b.table(idx)
	args := []any{""}
	if !idx.Shared {
		args[0] = q.Tenant
	}
	where, args, err := filterSQL(q.Filters, args)
	if err != nil {
		return nil, err
	}
	tsq, err := prefixQuery(q.Text)
	if err != nil {
		return nil, err
	}
	from, order := t, ""
	if tsq != "" {
		// to_tsquery runs once, in FROM; the match and the rank share it.
		args = append(args, tsq)
		from += fmt.Sprintf(", to_tsquery(%s::regconfig, $%d) AS q", quoteLiteral(b.cfg.TextSearchConfig), len(args))
		where += " AND search_text @@ q"
		order = "ts_rank(search_text, q) DESC, "
	}
	if len(q.Sort) > 0 {
		order = ""
		for _, s := range q.Sort {
			order += "doc -> " + quoteLiteral(s.Attr)
			if s.Desc {
				order += " DESC"
			}
			// Documents without the attribute come last either way, as
			// in Meilisearch.
			order += " NULLS LAST, "
		}
	}
	args = append(args, q.Limit, q.Offset)
	sql := fmt.Sprintf(`SELECT doc FROM %s WHERE tenant_id = $1%s ORDER BY %sid LIMIT $%d OFFSET $%d`, from, where, order, len(args)-1, len(args))
	db, err := b.database()
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", t, err)
	}
	docs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", t, err)
	}
	out := make([]json.RawMessage, len(docs))
	for i, d := range docs {
		out[i] = d
	}
	return out, nil
}

// prefixQuery turns free text into a to_tsquery expression matching
// every word as a prefix: "print jam" → 'print':* & 'jam':*. Words are
// search.QueryTerms (letters and digits only, so the expression needs no
// further escaping), which bounds their number: each is a condition, and
// an unbounded AND of them once exhausted PostgreSQL's stack.
func prefixQuery(text string) (string, error) {
	words, err := search.QueryTerms(text)
	if err != nil {
		return "", err
	}
	for i, w := range words {
		words[i] = "'" + w + "':*"
	}
	return strings.Join(words, " & "), nil
}

// Documents lists every document of idx, ordered by tenant and id.
func (b *Backend) Documents(ctx context.Context, idx search.Index) ([]search.Stored, error) {
	t := b.table(idx)
	db, err := b.database()
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT tenant_id, id, doc FROM `+t+` ORDER BY tenant_id, id`)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", t, err)
	}
	docs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (search.Stored, error) {
		var s search.Stored
		err := row.Scan(&s.Tenant, &s.ID, &s.Doc)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", t, err)
	}
	return docs, nil
}

// EachDocument hands every document of idx to fn as the rows arrive, in
// no particular order, holding none of them: search.Verify pages with it.
func (b *Backend) EachDocument(ctx context.Context, idx search.Index, fn func(search.Stored) error) error {
	t := b.table(idx)
	db, err := b.database()
	if err != nil {
		return err
	}
	rows, err := db.Query(ctx, `SELECT tenant_id, id, doc FROM `+t)
	if err != nil {
		return fmt.Errorf("list %s: %w", t, err)
	}
	var s search.Stored
	if _, err := pgx.ForEachRow(rows, []any{&s.Tenant, &s.ID, &s.Doc}, func() error {
		doc := s
		s.Doc = nil // a fresh buffer for the next row; fn may keep this one
		return fn(doc)
	}); err != nil {
		return fmt.Errorf("list %s: %w", t, err)
	}
	return nil
}
