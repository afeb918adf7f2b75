package postgres

import "context"

// PositionColumns lets the external tests compare the repair's list of
// stored transaction ids with the schema's xid8 columns.
var PositionColumns = positionColumns

// ExplainReadLog runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) on the statement
// ReadLog sends for q, for tests of what a read costs.
func (s *Store) ExplainReadLog(ctx context.Context, q LogQuery) ([]byte, error) {
	sql, args := s.readLogQuery(q, q.Limit)
	var plan []byte
	err := s.pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&plan)
	return plan, err
}
