package projection

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// replayKey carries a handler's replay state: whether the events it is
// given were handled before, and where a shadow build's tables are.
type replayKey struct{}

// replayState is what a handler running in a replay can ask about.
type replayState struct {
	// tables maps a declared table's qualified name to the same table in
	// the shadow schema (blue/green), nil in place.
	tables map[string]string
	// rebuildID is the blue/green rebuild a shadow pass builds, 0 in place.
	rebuildID int64
}

// Replaying reports whether the events a handler is given were already
// handled by a live version of its projection: during a rebuild (in place
// up to the position the rebuild started at, blue/green always). A handler
// with effects outside its transaction — a mail, an HTTP call, a publish —
// must not repeat them then; [SkipOnReplay] wraps one that should not run
// at all. Events a handler emits during a replay are not appended again
// (see [Emit]).
func Replaying(ctx context.Context) bool {
	_, ok := ctx.Value(replayKey{}).(*replayState)
	return ok
}

func withReplay(ctx context.Context, st *replayState) context.Context {
	return context.WithValue(ctx, replayKey{}, st)
}

// SkipOnReplay wraps a handler that must not run during a replay: one whose
// whole job is an effect outside the database (sending the welcome mail).
// Live, it runs as usual; replayed, it is skipped as if it had succeeded.
func SkipOnReplay(fn HandlerFunc) HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if Replaying(ctx) {
			return nil
		}
		return fn(ctx, tx, ev)
	}
}

// SkipOnReplayTyped is [SkipOnReplay] for typed handlers registered with [On].
func SkipOnReplayTyped[T any](fn Typed[T]) Typed[T] {
	return func(ctx context.Context, tx pgx.Tx, ev projector.Event, payload T) error {
		if Replaying(ctx) {
			return nil
		}
		return fn(ctx, tx, ev, payload)
	}
}

// Table returns the identifier, quoted for SQL, under which a handler
// writes the declared read-model table name ("table" or "schema.table", as
// in [AsyncConfig.Tables]): the live table normally, the shadow table while
// a blue/green rebuild builds a new version. Handlers that write unqualified
// table names need not call it (a shadow pass puts its schema first on the
// search_path); handlers that qualify names must.
func Table(ctx context.Context, name string) string {
	if st, ok := ctx.Value(replayKey{}).(*replayState); ok {
		if shadow, ok := st.tables[name]; ok {
			return shadow
		}
	}
	return quoteQualified(name)
}

// quoteQualified quotes "table" or "schema.table".
func quoteQualified(name string) string {
	if schema, rel, ok := strings.Cut(name, "."); ok {
		return pgx.Identifier{schema, rel}.Sanitize()
	}
	return pgx.Identifier{name}.Sanitize()
}
