package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// A merged read (a partition's, a few types') runs under a generic plan
// that PostgreSQL makes once per connection and statement, at its first
// execution there (readMerged). Making it costs the server several times
// what running it does: 3.5–4.3 ms for a partition of 8 on a quiet 2-core
// machine, against 0.2–0.7 ms once made, more for wider segments. A
// partition's statement depends on its segment's size, so a split or a
// merge switches every partition involved to a statement no connection has
// planned: after a split 4 → 8, eight halves planned at once, on a 2-core
// machine, and their first reads took 15–82 ms where a read took 1–5 ms
// (docs/performance.md, "The neighbouring sizes planned ahead"). That cost
// lands on the events committed during the change, the very ones issue 21
// wants to see applied within a batch of their commit.
//
// PlanLogRead pays it ahead of time, on a connection that is otherwise
// idle: the dispatcher hands the connection of a partition's pass, once
// the pass is done, to plan the reads of the sizes its partition would
// split or merge into, once per connection (LogReadPlanned).

// plannedKey is the key, in a connection's pgconn CustomData, of the set
// of merged-read statements planned on it by PlanLogRead or marked by
// markPlanned.
const plannedKey = "projector.planned_reads"

// plannedOn returns conn's set of planned statements, made on first use.
// A connection is used by one goroutine at a time, so the map needs no
// lock.
func plannedOn(conn *pgx.Conn) map[string]struct{} {
	data := conn.PgConn().CustomData()
	if m, ok := data[plannedKey].(map[string]struct{}); ok {
		return m
	}
	m := map[string]struct{}{}
	data[plannedKey] = m
	return m
}

// LogReadPlanned reports whether the statement a read of q runs is known
// to be planned on conn: PlanLogRead ran it there. A read that is not a
// merge (no partition, no type filter, many types) is planned at each run
// and reports true.
func (s *Store) LogReadPlanned(conn *pgx.Conn, q LogQuery) bool {
	sql, _, merged := s.readLogQuery(q, 0)
	if !merged {
		return true
	}
	_, ok := plannedOn(conn)[sql]
	return ok
}

// PlanLogRead prepares and plans on conn, outside any transaction of the
// caller's, the statement a read of q runs, by running it once with a
// limit of zero: it returns no event and takes no lock beyond the catalog
// ones any read takes. It does nothing when LogReadPlanned says the
// statement is planned. q's position and filters do not matter to the
// plan (it is generic), only its shape: the partition's size, the number
// of types, whether the archive is read.
func (s *Store) PlanLogRead(ctx context.Context, conn *pgx.Conn, q LogQuery) error {
	sql, args, merged := s.readLogQuery(q, 0)
	if !merged {
		return nil
	}
	planned := plannedOn(conn)
	if _, ok := planned[sql]; ok {
		return nil
	}
	var horizon uint64
	if _, err := s.readMerged(ctx, conn, sql, args, &horizon, q.Raw); err != nil {
		return err
	}
	planned[sql] = struct{}{}
	return nil
}
