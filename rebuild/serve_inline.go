package rebuild

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// DefaultServeInlineEvery is how often [ServeInline] looks for requested
// inline rebuilds.
const DefaultServeInlineEvery = time.Second

// serveInlineRetry is how long ServeInline waits before carrying on a
// rebuild whose last run failed (a handler error, the database away), so a
// failing handler is not re-run in a tight loop.
const serveInlineRetry = 5 * time.Second

// ServeInline carries out the rebuilds of the inline projections ps that
// are recorded in the database — requested with [Request] (`projector
// rebuild NAME` from any binary, even one without the projections' code),
// or interrupted in another process — until ctx ends. It is how a rebuild
// requested by an ops binary reaches the code that can replay it: `projector
// run` calls it for the binary's inline projections (those with tables,
// [projection.Inline.SetTables]). It looks every interval (0: the default),
// runs each rebuild of a version it has as [Inline] does (a session lock
// keeps one process on a rebuild; the others skip it), and logs what
// happened. A run that failed is tried again after a pause, resuming from
// its cursor; stopping ctx leaves a rebuild where it is, for the next
// process to resume.
func ServeInline(ctx context.Context, store *postgres.Store, ps []*projection.Inline, opts InlineOptions, logger *slog.Logger, every time.Duration) {
	logger = cmp.Or(logger, slog.Default())
	every = cmp.Or(every, DefaultServeInlineEvery)
	byName := map[string]*projection.Inline{}
	var names []string
	for _, p := range ps {
		byName[p.Name()] = p
		names = append(names, p.Name())
	}
	if len(names) == 0 {
		return
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		running = map[int64]bool{}
		retryAt = map[int64]time.Time{}
	)
	defer wg.Wait()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		rows, err := store.Pool().Query(ctx, `SELECT id, name, version, coalesce(shadow_schema, '') FROM `+store.Table("projector_rebuilds")+`
			WHERE status = 'building' AND mode = 'blue-green' AND name = ANY($1) ORDER BY id`, names)
		type todo struct {
			id      int64
			name    string
			version int
			schema  string
		}
		var found []todo
		if err == nil {
			for rows.Next() {
				var t todo
				if err = rows.Scan(&t.id, &t.name, &t.version, &t.schema); err != nil {
					break
				}
				found = append(found, t)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil && ctx.Err() == nil {
			logger.WarnContext(ctx, "rebuild: looking for inline rebuilds failed", slog.Any("error", err))
		}
		for _, t := range found {
			p := byName[t.name]
			mu.Lock()
			skip := running[t.id] || time.Now().Before(retryAt[t.id]) || !isInlineShadow(store.Schema(), t.name, t.schema) || p.Version() != t.version
			if !skip {
				running[t.id] = true
			}
			mu.Unlock()
			if skip {
				continue
			}
			wg.Go(func() {
				res, err := runInline(ctx, store, p, opts, t.id)
				mu.Lock()
				delete(running, t.id)
				if err != nil {
					retryAt[t.id] = time.Now().Add(serveInlineRetry)
				}
				mu.Unlock()
				switch {
				case err == nil:
					logger.InfoContext(ctx, "rebuild: inline rebuild switched",
						slog.String("projection", t.name), slog.Int64("rebuild", t.id), slog.Int("replayed", res.Replayed),
						slog.Int("under_lock", res.CaughtUp), slog.Duration("lock_held", res.LockHeld), slog.String("old_schema", res.OldSchema))
				case errors.Is(err, ErrActive):
					logger.DebugContext(ctx, "rebuild: inline rebuild runs elsewhere", slog.String("projection", t.name), slog.Any("error", err))
				case ctx.Err() != nil:
					logger.InfoContext(ctx, "rebuild: inline rebuild stopped; it resumes from its cursor", slog.String("projection", t.name), slog.Int64("rebuild", t.id))
				default:
					logger.ErrorContext(ctx, "rebuild: inline rebuild failed; trying again shortly", slog.String("projection", t.name),
						slog.Int64("rebuild", t.id), slog.Any("error", err))
				}
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
