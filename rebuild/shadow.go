package rebuild

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// shadowSchema names the schema a blue/green rebuild builds in: the store's
// schema (cut so the name fits PostgreSQL's 63 bytes) and the rebuild's id,
// unique among side-by-side Projector schemas of one database. The switch
// moves the old tables to the same name with "_old".
func shadowSchema(storeSchema string, id int64) string {
	suffix := fmt.Sprintf("_rebuild_%d", id)
	if max := 63 - len(suffix) - len("_old"); len(storeSchema) > max {
		storeSchema = storeSchema[:max]
	}
	return storeSchema + suffix
}

// startBlueGreen creates the shadow schema, a copy of each declared table
// in it and the shadow shard that dispatchers of the version build it with.
func startBlueGreen(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, d decl, id int64) error {
	schema := shadowSchema(store.Schema(), id)
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE SCHEMA `+q); err != nil {
		return fmt.Errorf("rebuild %s: create the shadow schema %s: %w", name, schema, err)
	}
	rels := map[string]string{}
	for _, t := range d.tables {
		_, rel, _ := strings.Cut(t, ".")
		if other, ok := rels[rel]; ok {
			return fmt.Errorf("%w: %s declares %s and %s: tables of one projection need distinct names to share a shadow schema", ErrNotRebuildable, name, other, t)
		}
		rels[rel] = t
		if err := copyTable(ctx, tx, name, t, schema, rel); err != nil {
			return err
		}
	}
	if len(d.tables) > 0 {
		if err := grantSchemaLike(ctx, tx, name, d.tables[0], schema); err != nil {
			return err
		}
	}
	// A projection with an external target (and perhaps no tables) gets
	// the schema all the same: its shadow passes run like any other, and
	// the dispatchers build the shadow target (External.PrepareShadow).
	_ = d.external
	if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET shadow_schema = $2 WHERE id = $1`, id, schema); err != nil {
		return fmt.Errorf("rebuild %s: record the shadow schema: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+store.Table("projector_consumers")+`
			(name, instance_id, cursor_tx_id, cursor_seq, version, shadow_schema) VALUES ($1, $2, '0', 0, $3, $4)`,
		name, projection.RebuildInstance, d.version, schema); err != nil {
		return fmt.Errorf("rebuild %s: register the shadow shard: %w", name, err)
	}
	return nil
}

// copyTable creates shadow.rel like the live table t, with what readers and
// writers of t rely on that LIKE does not copy: grants, row-level security
// and its policies, the owner. It refuses what a switch could not carry
// over: views and foreign keys that point at t (they would keep pointing at
// the old table) and sequence defaults (serial columns: the new table would
// share the old table's sequence, which `drop-old` would drop).
func copyTable(ctx context.Context, tx pgx.Tx, name, t, schema, rel string) error {
	live := qualified(t)
	var problems []string
	rows, err := tx.Query(ctx, `
		SELECT 'view ' || v.oid::regclass::text || ' reads it'
			FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid JOIN pg_class v ON v.oid = w.ev_class
			WHERE d.refobjid = $1::regclass AND d.classid = 'pg_rewrite'::regclass AND v.oid <> $1::regclass
		UNION
		SELECT 'foreign key ' || c.conname || ' of ' || c.conrelid::regclass::text || ' references it'
			FROM pg_constraint c WHERE c.confrelid = $1::regclass AND c.contype = 'f' AND c.conrelid <> $1::regclass
		UNION
		SELECT 'column ' || a.attname || ' takes its default from a sequence (a serial column; use GENERATED ... AS IDENTITY)'
			FROM pg_attrdef ad JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
			WHERE ad.adrelid = $1::regclass AND pg_get_expr(ad.adbin, ad.adrelid) LIKE 'nextval(%'`, live)
	if err == nil {
		problems, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("rebuild %s: inspect table %s: %w", name, t, err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: table %s: %s", ErrNotRebuildable, t, strings.Join(problems, "; "))
	}
	shadow := pgx.Identifier{schema, rel}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE TABLE `+shadow+` (LIKE `+live+` INCLUDING ALL)`); err != nil {
		return fmt.Errorf("rebuild %s: copy table %s: %w", name, t, err)
	}
	var stmts []string
	// Grants, as aclexplode reads them (information_schema shows only the
	// caller's own).
	rows, err = tx.Query(ctx, `SELECT 'GRANT ' || a.privilege_type || ' ON ' || $2::text || ' TO ' ||
			CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END ||
			CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
		FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
		WHERE c.oid = $1::regclass AND a.grantee <> c.relowner`, live, shadow)
	if err == nil {
		stmts, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("rebuild %s: read the grants of %s: %w", name, t, err)
	}
	// Row-level security and its policies.
	var rls, force bool
	var owner string
	var mayOwn bool
	if err := tx.QueryRow(ctx, `SELECT c.relrowsecurity, c.relforcerowsecurity, quote_ident(r.rolname), pg_has_role(c.relowner, 'MEMBER')
		FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = $1::regclass`, live).Scan(&rls, &force, &owner, &mayOwn); err != nil {
		return fmt.Errorf("rebuild %s: read %s: %w", name, t, err)
	}
	if rls {
		stmts = append(stmts, `ALTER TABLE `+shadow+` ENABLE ROW LEVEL SECURITY`)
	}
	if force {
		stmts = append(stmts, `ALTER TABLE `+shadow+` FORCE ROW LEVEL SECURITY`)
	}
	rows, err = tx.Query(ctx, `SELECT 'CREATE POLICY ' || quote_ident(p.polname) || ' ON ' || $2::text ||
			' AS ' || CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END ||
			' FOR ' || CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END ||
			' TO ' || CASE WHEN p.polroles = '{0}' THEN 'PUBLIC' ELSE (SELECT string_agg(quote_ident(rolname), ', ') FROM pg_roles WHERE oid = ANY(p.polroles)) END ||
			coalesce(' USING (' || pg_get_expr(p.polqual, p.polrelid) || ')', '') ||
			coalesce(' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')', '')
		FROM pg_policy p WHERE p.polrelid = $1::regclass ORDER BY p.polname`, live, shadow)
	if err == nil {
		var policies []string
		policies, err = pgx.CollectRows(rows, pgx.RowTo[string])
		stmts = append(stmts, policies...)
	}
	if err != nil {
		return fmt.Errorf("rebuild %s: read the policies of %s: %w", name, t, err)
	}
	if mayOwn {
		stmts = append(stmts, `ALTER TABLE `+shadow+` OWNER TO `+owner)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("rebuild %s: copy %s: %s: %w", name, t, s, err)
		}
	}
	return nil
}

// grantSchemaLike gives the shadow schema the usage grants of the live
// table's schema, so the roles that write the live tables (a tenant role,
// the application's) can write the shadow ones.
func grantSchemaLike(ctx context.Context, tx pgx.Tx, name, t, schema string) error {
	liveSchema, _, _ := strings.Cut(t, ".")
	rows, err := tx.Query(ctx, `SELECT 'GRANT ' || a.privilege_type || ' ON SCHEMA ' || $2::text || ' TO ' ||
			CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
		FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
		WHERE n.nspname = $1 AND a.grantee <> n.nspowner`, liveSchema, pgx.Identifier{schema}.Sanitize())
	if err != nil {
		return fmt.Errorf("rebuild %s: read the grants of schema %s: %w", name, liveSchema, err)
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("rebuild %s: read the grants of schema %s: %w", name, liveSchema, err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("rebuild %s: %s: %w", name, s, err)
		}
	}
	return nil
}
