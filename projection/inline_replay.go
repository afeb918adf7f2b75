package projection

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ReplayInline applies p's handlers to events (in log order) inside tx as a
// replay: [Replaying] is true, [SkipOnReplay] handlers do not run, [Emit]
// appends nothing, and [Table] maps each declared table's qualified name to
// its entry in tables (the shadow table a rebuild writes; nil leaves names
// as they are). It is the building block of an inline projection's rebuild
// (package rebuild), which points tx's search_path at its shadow schema and
// commits; a handler error is returned as is, and the caller rolls back.
// Handlers run in tx as the caller scoped it, as they do in an append.
func ReplayInline(ctx context.Context, tx pgx.Tx, p *Inline, events []projector.Event, tables map[string]string) error {
	return p.ApplyInline(withReplay(ctx, &replayState{tables: tables}), tx, events)
}
