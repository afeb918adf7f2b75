package rebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// ErrArchived: events the projection reads are archived (`projector
// streams archive`). A replay reads projector_events only, so it would
// build a model without them; the rebuild is refused until they are
// unarchived (`projector streams unarchive`). Reading the archive in the
// replay is not done yet (docs/operations.md, "Archiving closed streams").
var ErrArchived = errors.New("rebuild: events the projection needs are archived")

// checkArchived refuses a rebuild of a projection of types (every type
// when none) while an event of those types is archived. Called from
// checkPruned, and so also under the ROW EXCLUSIVE lock of recheckPruned:
// an archive batch reads the cursors under a SHARE lock on the consumers
// table, so one that committed before is seen here and one that comes
// after sees the rebuild's rewound cursor and archives nothing it needs.
func checkArchived(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, types []string) error {
	archive := store.Table("projector_events_archive")
	var q string
	var args []any
	if len(types) == 0 {
		q = `SELECT a.type FROM ` + archive + ` a LIMIT 1`
	} else {
		q = `SELECT t FROM unnest($1::text[]) AS t WHERE EXISTS (SELECT 1 FROM ` + archive + ` a WHERE a.type = t) ORDER BY t`
		args = append(args, types)
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("rebuild %s: look for archived events: %w", name, err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("rebuild %s: look for archived events: %w", name, err)
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: %s reads event types with archived events (%s); a replay would build a model without them: "+
			"run `projector streams unarchive` for those streams first", ErrArchived, name, strings.Join(found, ", "))
	}
	return nil
}
