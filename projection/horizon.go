package projection

import (
	"context"
	"fmt"
	"time"

	"github.com/projectorhq/projector/stores/postgres"
)

// HorizonQueryChars is how much of a holder's current query [Horizon]
// reports: enough to recognise it, not a whole generated statement.
const HorizonQueryChars = 200

// HorizonHolderKinds: a session of the cluster with a transaction id, or a
// prepared (two-phase) transaction that no session holds any more.
const (
	HolderSession  = "session"
	HolderPrepared = "prepared"
)

// HorizonHolder is a transaction of the cluster that holds the horizon
// back: every consumer reads only events of transactions older than the
// oldest one still running (promise 3), and transaction ids are
// cluster-wide, so it may be in another database.
type HorizonHolder struct {
	// Kind is HolderSession or HolderPrepared.
	Kind string `json:"kind"`
	// PID is the session's process id (pg_terminate_backend(pid) ends it);
	// 0 for a prepared transaction.
	PID int32 `json:"pid,omitempty"`
	// GID is a prepared transaction's global id (ROLLBACK PREPARED 'gid'
	// ends it, run in its database).
	GID      string `json:"gid,omitempty"`
	Database string `json:"database"`
	User     string `json:"user"`
	// ApplicationName, State and Query are the session's; empty for a
	// prepared transaction. Query is the first HorizonQueryChars
	// characters of its current (or, when idle in transaction, last)
	// statement.
	ApplicationName string `json:"application_name,omitempty"`
	State           string `json:"state,omitempty"`
	Query           string `json:"query,omitempty"`
	// Since is when the transaction started (a prepared one: when it was
	// prepared).
	Since time.Time `json:"since"`
	// TxID is its transaction id (32-bit, as pg_stat_activity shows it).
	TxID uint32 `json:"xid"`
	// Hidden: the session is another role's and this role may not read its
	// state, transaction start or query (zero here): see
	// [HorizonReport.Missing].
	Hidden bool `json:"hidden,omitempty"`
}

// HorizonReport says how far the horizon is behind and who holds it.
type HorizonReport struct {
	// AgeSeconds is how long the oldest open transaction with an id has
	// been running; 0 when there is none.
	AgeSeconds float64 `json:"age_seconds"`
	// Holder is the transaction the horizon waits for (the oldest
	// transaction id still running), nil when none holds it or when it is
	// not visible to this role (then Missing says why).
	Holder *HorizonHolder `json:"holder,omitempty"`
	// Others are the next oldest transactions with an id, at most four.
	Others []HorizonHolder `json:"others,omitempty"`
	// Database is the database the report was taken from: a holder in
	// another one holds this one's consumers back all the same.
	Database string `json:"database,omitempty"`
	// Missing says what this role cannot see: other roles' sessions show
	// neither their transaction ids nor their queries without
	// pg_read_all_stats.
	Missing string `json:"missing,omitempty"`
}

// horizonSQL lists the transactions with an id, oldest first: sessions of
// every database (pg_stat_activity is cluster-wide) and prepared
// transactions. It also returns the horizon (the oldest running xid, as the
// log reader computes it), whether this role may read every session's
// state, and how many sessions it cannot see.
var horizonSQL = `WITH h AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin, current_database() AS db,
		pg_has_role(current_user, 'pg_read_all_stats', 'member') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS all_stats,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND query = '<insufficient privilege>') AS hidden),
	t AS (
		SELECT 'session' AS kind, a.pid, '' AS gid, coalesce(a.datname, '') AS db, coalesce(a.usename, '') AS usr,
			coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state, left(coalesce(a.query, ''), ` + fmt.Sprint(HorizonQueryChars) + `) AS query,
			a.xact_start AS since, a.backend_xid AS xid
		FROM pg_stat_activity a WHERE a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
		UNION ALL
		SELECT 'prepared', 0, p.gid, p.database, p.owner, '', '', '', p.prepared, p.transaction
		FROM pg_prepared_xacts p)
	SELECT h.xmin::text, h.db, h.all_stats, h.hidden, t.kind, t.pid, t.gid, t.db, t.usr, t.app, t.state, t.query, t.since,
		t.xid::text::bigint, (t.xid = xid(h.xmin)), extract(epoch FROM now() - t.since)::float8
	FROM h LEFT JOIN LATERAL (SELECT * FROM t ORDER BY age(t.xid) DESC LIMIT 5) t ON true`

// Horizon reports the horizon's age and the transaction holding it, from
// pg_stat_activity and pg_prepared_xacts, as db's role sees them (any
// connection to the cluster will do: both views are cluster-wide). When that
// role cannot see other roles' sessions, Missing says so (and what to
// grant) rather than reporting nothing.
func Horizon(ctx context.Context, db postgres.DBTX) (HorizonReport, error) {
	var rep HorizonReport
	rows, err := db.Query(ctx, horizonSQL)
	if err != nil {
		return rep, fmt.Errorf("horizon: %w", err)
	}
	defer rows.Close()
	var allStats, found bool
	var hidden int64
	for rows.Next() {
		var xmin string
		var kind, gid, dbName, user, app, state, query *string
		var pid *int32
		var since *time.Time
		var xid *int64
		var holds *bool
		var age *float64
		if err := rows.Scan(&xmin, &rep.Database, &allStats, &hidden, &kind, &pid, &gid, &dbName, &user, &app, &state, &query, &since, &xid, &holds, &age); err != nil {
			return rep, fmt.Errorf("horizon: %w", err)
		}
		if kind == nil {
			continue // no transaction with an id
		}
		h := HorizonHolder{Kind: *kind, PID: *pid, GID: *gid, Database: *dbName, User: *user, ApplicationName: *app,
			State: *state, Query: *query, TxID: uint32(*xid)}
		if since != nil {
			h.Since = *since
		}
		if h.Kind == HolderSession && (since == nil || h.Query == "<insufficient privilege>") {
			h.Hidden, h.Query = true, ""
		}
		if age != nil {
			rep.AgeSeconds = max(rep.AgeSeconds, *age)
		}
		if *holds && !found {
			found = true
			rep.Holder = &h
			continue
		}
		rep.Others = append(rep.Others, h)
	}
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("horizon: %w", err)
	}
	if rep.Holder == nil && allStats && len(rep.Others) > 0 {
		// This role sees every session, so the snapshot's holder ended
		// between the snapshot and the read of pg_stat_activity (ordinary
		// traffic: every writing transaction holds the horizon while it
		// runs). The oldest transaction still running holds it now.
		h := rep.Others[0]
		rep.Holder, rep.Others = &h, rep.Others[1:]
	}
	switch {
	case rep.Holder != nil && rep.Holder.Hidden:
		rep.Missing = "the holder is another role's session: this role may not see its state, transaction start (so the horizon's age) or query; " +
			"GRANT pg_read_all_stats TO the role this command connects as, or run it as a superuser"
	case !allStats && hidden > 0 && rep.Holder == nil && len(rep.Others) > 0:
		rep.Missing = fmt.Sprintf("%d sessions of other roles are hidden from this role: the horizon may be held by one of them; "+
			"GRANT pg_read_all_stats TO the role this command connects as, or run it as a superuser", hidden)
	}
	if rep.Holder == nil && len(rep.Others) > 0 && rep.Missing == "" {
		// The oldest visible transaction is not the horizon's: it began
		// (or took its id) after one we were not shown.
		rep.Missing = "the transaction holding the horizon is not visible to this role"
	}
	return rep, nil
}
