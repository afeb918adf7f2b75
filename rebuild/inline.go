package rebuild

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgretry"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrInlineVersion means an inline rebuild was refused, or its switch
// abandoned, because the inline projection's version recorded in the schema
// (projector_inline_projections, written by every store that runs it) is not
// the version being rebuilt, or changed too recently for every process to
// have seen it: processes running another version may still write the live
// tables, and the rebuilt model would not be what they expect.
var ErrInlineVersion = errors.New("rebuild: the inline projection's recorded version does not allow this rebuild")

// Defaults of [InlineOptions].
const (
	// DefaultInlineBatchSize is how many events one shadow transaction replays.
	DefaultInlineBatchSize = 1000
	// DefaultInlineGrace is how long the recorded version must have stood
	// before a rebuild starts: ten times the stores' default InlineRefresh,
	// so every store has re-read the record (and refuses appends if it runs
	// an older version) and its last appends under an older reading have
	// committed.
	DefaultInlineGrace = 10 * postgres.DefaultInlineRefresh
	// DefaultInlineLockTimeout bounds each attempt to lock the live tables
	// for the switch, so appends never queue behind the rebuild for longer.
	DefaultInlineLockTimeout = 100 * time.Millisecond
	// DefaultInlineLockAttempts is how many times the switch tries the lock.
	DefaultInlineLockAttempts = 50
	// DefaultInlineMaxUnderLock caps the events the switch may apply under
	// its lock; see InlineOptions.MaxUnderLock.
	DefaultInlineMaxUnderLock = 5000
	// DefaultInlineSettleTimeout bounds the wait for the replay to come
	// within MaxUnderLock of the log.
	DefaultInlineSettleTimeout = time.Minute
)

// ErrHorizonHeld: an inline rebuild could not get close enough to the log
// to switch under a short lock, because a transaction somewhere in the
// cluster holds the gap-safe horizon back (`projector horizon` names it).
var ErrHorizonHeld = errors.New("rebuild: the horizon is held back; the switch would hold the tables too long")

// A replay settles before the switch once a batch below the horizon brings
// at most settledEvents events, or after settleRounds such batches if the
// writers keep it busier than that.
const (
	settledEvents = 50
	settleRounds  = 20
)

// InlineOptions says how to rebuild an inline projection. Zero fields mean
// the documented defaults.
type InlineOptions struct {
	// Tables are the read-model tables the projection's handlers write,
	// "table" (resolved on the pool's search_path, as the handlers' names
	// are) or "schema.table". Required: they are copied, rebuilt and
	// switched; a table the handlers write that is not listed is neither.
	Tables []string
	// BatchSize is the number of events per shadow transaction; default
	// [DefaultInlineBatchSize], at most 100000.
	BatchSize int
	// Grace is how long the recorded version must have been the one being
	// rebuilt; default [DefaultInlineGrace]. Set it above the longest
	// InlineRefresh of the stores writing the schema.
	Grace time.Duration
	// LockTimeout bounds each attempt to take the switch's lock; default
	// [DefaultInlineLockTimeout].
	LockTimeout time.Duration
	// LockAttempts is how many times the switch tries; default
	// [DefaultInlineLockAttempts].
	LockAttempts int
	// MaxUnderLock caps the committed events the switch may still have to
	// apply under its lock; default [DefaultInlineMaxUnderLock]. The batches
	// only read below the gap-safe horizon, so while a long transaction
	// anywhere in the cluster holds it back, committed events pile up past
	// the replay: the switch waits for them to be replayed in batches first,
	// at most SettleTimeout, and refuses with [ErrHorizonHeld] rather than
	// lock the live tables for long.
	MaxUnderLock int
	// SettleTimeout is how long the switch waits for that; default
	// [DefaultInlineSettleTimeout].
	SettleTimeout time.Duration
}

// InlineResult is what [Inline] did.
type InlineResult struct {
	// Tables are the live tables, schema-qualified, now holding the
	// rebuilt model.
	Tables []string
	// OldSchema holds the tables that were live before the switch; drop it
	// (DROP SCHEMA ... CASCADE) once the new model is trusted.
	OldSchema string
	// Replayed counts the events applied in batches, before the switch.
	Replayed int
	// CaughtUp counts the events applied under the switch's lock.
	CaughtUp int
	// Attempts counts the tries to take the lock (1 when the first worked).
	Attempts int
	// LockWait is the time spent waiting for the lock over all attempts,
	// the last (successful) one included.
	LockWait time.Duration
	// LockHeld is how long the live tables were locked: from the lock being
	// granted to the commit of the switch. Appends of the event types the
	// projection handles that reach its tables wait this long (plus the
	// last wait) at most; reads of the tables too.
	LockHeld time.Duration
	// LockCatchUp is the part of LockHeld spent applying the CaughtUp
	// events; the rest is the swap's catalogue updates and the commit.
	LockCatchUp time.Duration
	// ID is the rebuild's record (List, `projector rebuild list`).
	ID int64
	// Resumed is set when this call carried on a rebuild that had
	// replayed part of the log before (a crash, a cancelled ctx); Replayed
	// then counts only this call's events.
	Resumed bool
}

// Inline rebuilds an inline projection's tables from the log while appends
// go on, in the caller's process (it runs p's handlers). It copies the
// declared tables into a shadow schema, replays the log into them in
// batches, then locks the live tables (ACCESS EXCLUSIVE, lock_timeout
// opts.LockTimeout, retried), applies the events committed since the last
// batch, and in the same transaction moves the live tables to an old schema
// and the shadow tables into their place. An append blocked by the lock
// resumes once it is released and writes the new tables. See
// docs/rebuilds.md, "Inline projections", for why the result is exact.
//
// The rebuild is recorded like the others (List, `projector status`, the
// progress gauge, Cancel): its cursor is committed with each batch of
// shadow writes, so after a crash, a cancelled ctx or a handler error the
// next Inline of the projection (or ServeInline) resumes where it stopped.
// A rebuild requested with [Request] (`projector rebuild NAME` from any
// binary) is the one Inline carries out; without one, Inline records it.
//
// It refuses ([ErrInlineVersion]) unless the schema records p's version for
// this projection, and has for opts.Grace; ([ErrUnknownProjection]) when no
// store has recorded the projection; ([ErrActive]) while another process
// replays it, or a rebuild of another version or other tables is in
// progress; ([ErrNoTables]) without tables (opts.Tables, else p.Tables());
// ([ErrPruned]) when retention deleted events of its types. Nothing of an
// unfinished rebuild is ever live: a refused or failed rebuild leaves the
// live tables as they were. A switch refused for its version fence, or for
// a held horizon ([ErrHorizonHeld]), ends the rebuild (cancelled, shadow
// dropped): it could not finish as it stands.
//
// The replay runs with the pool's role and session settings, unscoped:
// handlers that rely on a tenant scope set by the caller of Append see none.
func Inline(ctx context.Context, store *postgres.Store, p *projection.Inline, opts InlineOptions) (InlineResult, error) {
	return runInline(ctx, store, p, opts, 0)
}

// errCancelled: an operator cancelled the rebuild while it replayed.
var errCancelled = fmt.Errorf("%w: it was cancelled", ErrNotActive)

// runInline is Inline; with want > 0 it only carries on the recorded
// rebuild want (ServeInline), never starting another.
func runInline(ctx context.Context, store *postgres.Store, p *projection.Inline, opts InlineOptions, want int64) (InlineResult, error) {
	var res InlineResult
	name := p.Name()
	if err := p.Validate(store.Registry()); err != nil {
		return res, fmt.Errorf("rebuild inline %s: %w", name, err)
	}
	if err := opts.fill(); err != nil {
		return res, fmt.Errorf("rebuild inline %s: %w", name, err)
	}
	if len(opts.Tables) == 0 {
		opts.Tables = p.Tables()
	}
	if len(opts.Tables) == 0 {
		return res, fmt.Errorf("%w: rebuild inline %s: neither InlineOptions.Tables nor the projection (SetTables) lists the tables its handlers write", ErrNoTables, name)
	}
	types := p.EventTypes()

	// One process replays a projection at a time: a session lock on a
	// connection held for the whole run (released if the process dies).
	conn, err := store.Pool().Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("rebuild inline %s: %w", name, err)
	}
	defer conn.Release()
	key := inlineLockKey(store.Schema(), name)
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
		return res, fmt.Errorf("rebuild inline %s: %w", name, err)
	}
	if !got {
		return res, fmt.Errorf("%w: inline %s, in another process or goroutine", ErrActive, name)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key)
	}()

	shadow, base := inlineShadowSchema(store.Schema(), name)
	st, err := beginInline(ctx, store, p, opts, shadow, want)
	if err != nil {
		return res, err
	}
	res.ID, res.Tables, res.Resumed = st.id, st.live, st.resumed
	live := st.live
	// Handlers that qualify names find the shadow tables through
	// projection.Table, under the name as listed or as resolved; those that
	// do not, through the search_path.
	tables := make(map[string]string, 2*len(live))
	for i, t := range live {
		_, rel, _ := strings.Cut(t, ".")
		tables[t] = pgx.Identifier{shadow, rel}.Sanitize()
		tables[opts.Tables[i]] = tables[t]
	}
	// A rebuild that cannot finish as it stands ends here, shadow dropped.
	abandon := func(err error) (InlineResult, error) {
		if aerr := abandonInline(context.WithoutCancel(ctx), store, st.id, name, shadow, err); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return res, err
	}
	// Anything else leaves it in progress, to resume from its cursor.
	kept := func(err error) (InlineResult, error) {
		if !errors.Is(err, errCancelled) {
			if _, rerr := store.Pool().Exec(context.WithoutCancel(ctx), `UPDATE `+store.Table("projector_consumers")+`
				SET last_error = $3, last_error_at = now(), attempts = attempts + 1, updated_at = now() WHERE name = $1 AND instance_id = $2`,
				name, projection.RebuildInstance, err.Error()); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return res, fmt.Errorf("%w (rebuild %d stays in progress; it resumes from its cursor: run the rebuild again, or cancel it)", err, st.id)
	}
	shard := projection.ShardID{Consumer: name, Instance: projection.RebuildInstance}

	// Batches, gap-safe: each read stops below the oldest running
	// transaction, so the cursor never passes an event committed later. The
	// cursor commits with the batch's shadow writes: a crash loses both or
	// neither.
	cursor := st.cursor
	replayBatches := func() error {
		tail := 0
		for {
			var batch postgres.LogBatch
			// A batch that loses a conflict with another transaction (a
			// deadlock's victim, a serialization failure) committed
			// nothing: it is tried again, a few times, before the
			// rebuild stops with the error.
			err := pgretry.Do(ctx, "rebuild inline "+name+" batch", pgretry.Conflict, func() error {
				return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
					// Cancel takes this lock before dropping the shadow.
					if err := projection.LockShard(ctx, tx, store, shard); err != nil {
						return err
					}
					if err := stillBuilding(ctx, tx, store, st.id); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1 || ', ' || current_setting('search_path'), true),
						set_config('synchronous_commit', 'off', true)`, pgx.Identifier{shadow}.Sanitize()); err != nil {
						return err
					}
					// Below the archive's last event the replay reads the
					// archive too; the rebuild's cursor row holds `streams
					// archive` back from moving anything after it.
					archived, err := store.ArchivedAfter(ctx, tx, cursor)
					if err != nil {
						return err
					}
					if batch, err = store.ReadLogTx(ctx, tx, postgres.LogQuery{After: cursor, Limit: opts.BatchSize, EventTypes: types, IncludeArchived: archived}); err != nil {
						return err
					}
					if err := projection.ReplayInline(ctx, tx, p, batch.Events, tables); err != nil {
						return err
					}
					next := batch.Next(cursor)
					_, err = tx.Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` SET cursor_tx_id = $3, cursor_seq = $4,
						processed = processed + $5, attempts = 0, last_error = NULL, last_error_at = NULL, updated_at = now()
						WHERE name = $1 AND instance_id = $2`, name, projection.RebuildInstance, next.TxID, next.Seq, len(batch.Events))
					return err
				})
			})
			if err != nil {
				return fmt.Errorf("rebuild inline %s: replay after %s: %w", name, cursor, err)
			}
			res.Replayed += len(batch.Events)
			cursor = batch.Next(cursor)
			// Caught up to the horizon. Go on while the batches are
			// still large: what the writers appended while a batch was
			// replayed is applied under the lock, so the last batch
			// before it should be a short one.
			if !batch.Full {
				tail++
				if len(batch.Events) <= settledEvents || tail >= settleRounds {
					return nil
				}
			}
		}
	}
	if err := replayBatches(); err != nil {
		return kept(err)
	}
	// Close enough to the log to switch under a short lock?
	settleBy := time.Now().Add(opts.SettleTimeout)
	for {
		var pending int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+store.Table("projector_events")+` e
			WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.type = ANY($3::text[]) LIMIT $4) x`,
			cursor.TxID, cursor.Seq, p.EventTypes(), opts.MaxUnderLock+1).Scan(&pending); err != nil {
			return kept(fmt.Errorf("rebuild inline %s: count what the switch would apply: %w", name, err))
		}
		if pending <= opts.MaxUnderLock {
			break
		}
		if time.Now().After(settleBy) {
			return abandon(fmt.Errorf("%w: more than %d committed events of %s lie past the replay after %v (see `projector horizon`); nothing was switched",
				ErrHorizonHeld, opts.MaxUnderLock, name, opts.SettleTimeout))
		}
		t := time.NewTimer(100 * time.Millisecond) // the horizon moves when that transaction ends
		select {
		case <-ctx.Done():
			t.Stop()
			return kept(fmt.Errorf("rebuild inline %s: %w", name, ctx.Err()))
		case <-t.C:
		}
		if err := replayBatches(); err != nil {
			return kept(err)
		}
	}

	// The switch.
	old := base + "_old_" + strconv.FormatInt(time.Now().Unix(), 10)
	for {
		res.Attempts++
		n, wait, held, catchUp, err := switchInline(ctx, store, p, opts, st.id, shadow, old, live, tables, cursor)
		res.LockWait += wait
		if err == nil {
			res.CaughtUp, res.LockHeld, res.LockCatchUp, res.OldSchema = n, held, catchUp, old
			return res, nil
		}
		if errors.Is(err, ErrInlineVersion) {
			return abandon(fmt.Errorf("rebuild inline %s: switch (attempt %d): %w", name, res.Attempts, err))
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "55P03" && !pgretry.Conflict(err)) || res.Attempts >= opts.LockAttempts {
			return kept(fmt.Errorf("rebuild inline %s: switch (attempt %d): %w", name, res.Attempts, err))
		}
		// Readers or appends held the tables past the timeout, or the
		// catch-up under the lock lost a conflict (rolled back, nothing
		// switched): let them through, then catch up again so the next
		// lock is as short.
		t := time.NewTimer(time.Duration(res.Attempts) * opts.LockTimeout / 2)
		select {
		case <-ctx.Done():
			t.Stop()
			return kept(fmt.Errorf("rebuild inline %s: %w", name, ctx.Err()))
		case <-t.C:
		}
		if err := replayBatches(); err != nil {
			return kept(err)
		}
	}
}

// inlineStart is where an inline rebuild starts or resumes.
type inlineStart struct {
	id      int64
	live    []string // the live tables, schema-qualified
	cursor  projector.Position
	resumed bool
}

// stillBuilding fails with errCancelled once the rebuild is no longer in
// progress (an operator cancelled it).
func stillBuilding(ctx context.Context, tx pgx.Tx, store *postgres.Store, id int64) error {
	var status string
	if err := tx.QueryRow(ctx, `SELECT status FROM `+store.Table("projector_rebuilds")+` WHERE id = $1`, id).Scan(&status); err != nil {
		return fmt.Errorf("read rebuild %d: %w", id, err)
	}
	if status != string(Building) {
		return fmt.Errorf("rebuild %d: %w (%s)", id, errCancelled, status)
	}
	return nil
}

// abandonInline ends a rebuild that cannot finish as it stands: the shadow
// shard and schema are dropped and the record says why. The live tables
// were never touched.
func abandonInline(ctx context.Context, store *postgres.Store, id int64, name, shadow string, cause error) error {
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		// The order Cancel locks in: the record, then the shard.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM `+store.Table("projector_rebuilds")+` WHERE id = $1 FOR UPDATE`, id); err != nil {
			return fmt.Errorf("rebuild inline %s: end it: %w", name, err)
		}
		if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: name, Instance: projection.RebuildInstance}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2`,
			name, projection.RebuildInstance); err != nil {
			return fmt.Errorf("rebuild inline %s: remove its cursor: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{shadow}.Sanitize()+` CASCADE`); err != nil {
			return fmt.Errorf("rebuild inline %s: drop the shadow schema: %w", name, err)
		}
		_, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET status = 'cancelled', finished_at = now(), note = $2
			WHERE id = $1 AND status IN ('building', 'ready')`, id, "ended: "+cause.Error())
		if err != nil {
			return fmt.Errorf("rebuild inline %s: record its end: %w", name, err)
		}
		return nil
	})
}

func (o *InlineOptions) fill() error {
	switch {
	case o.BatchSize < 0 || o.BatchSize > 100000:
		return fmt.Errorf("batch size %d: want 1 to 100000 (0 means %d)", o.BatchSize, DefaultInlineBatchSize)
	case o.Grace < 0:
		return fmt.Errorf("grace %v: want 0 (default %v) or more", o.Grace, DefaultInlineGrace)
	case o.LockTimeout < 0 || (o.LockTimeout > 0 && o.LockTimeout < time.Millisecond):
		return fmt.Errorf("lock timeout %v: want 1ms or more (0 means %v)", o.LockTimeout, DefaultInlineLockTimeout)
	case o.LockAttempts < 0:
		return fmt.Errorf("lock attempts %d: want 1 or more (0 means %d)", o.LockAttempts, DefaultInlineLockAttempts)
	case o.MaxUnderLock < 0 || o.MaxUnderLock > 1_000_000:
		return fmt.Errorf("max under lock %d: want 1 to 1000000 (0 means %d)", o.MaxUnderLock, DefaultInlineMaxUnderLock)
	case o.SettleTimeout < 0:
		return fmt.Errorf("settle timeout %v: want 0 (default %v) or more", o.SettleTimeout, DefaultInlineSettleTimeout)
	}
	o.MaxUnderLock = cmp.Or(o.MaxUnderLock, DefaultInlineMaxUnderLock)
	o.SettleTimeout = cmp.Or(o.SettleTimeout, DefaultInlineSettleTimeout)
	if o.BatchSize == 0 {
		o.BatchSize = DefaultInlineBatchSize
	}
	if o.Grace == 0 {
		o.Grace = DefaultInlineGrace
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultInlineLockTimeout
	}
	if o.LockAttempts == 0 {
		o.LockAttempts = DefaultInlineLockAttempts
	}
	return nil
}

// inlineLockKey is the advisory lock an inline rebuild of name holds.
func inlineLockKey(schema, name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("projector.inline_rebuild\x00" + schema + "\x00" + name))
	return int64(h.Sum64())
}

// inlineShadowSchema names the schema an inline rebuild of name builds in:
// one per projection, so a rebuild after a crash finds and drops the
// leftover. base also prefixes the old schema, which gets a timestamp.
func inlineShadowSchema(storeSchema, name string) (shadow, base string) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	suffix := fmt.Sprintf("_irb_%08x", h.Sum32())
	if max := 63 - len(suffix) - len("_old_") - 10; len(storeSchema) > max {
		storeSchema = storeSchema[:max]
	}
	return storeSchema + suffix, storeSchema + suffix
}

// checkInlineVersion applies the version fence: the schema must record
// p's version, and for at least grace (0: only the version is checked).
// lock takes the record FOR SHARE, so no store can raise the version before
// the caller's transaction ends.
func checkInlineVersion(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *projection.Inline, grace time.Duration, lock bool) error {
	q := `SELECT version, extract(epoch FROM now() - updated_at) FROM ` + store.Table("projector_inline_projections") + ` WHERE name = $1`
	if lock {
		q += ` FOR SHARE`
	}
	var version int
	var age float64
	err := tx.QueryRow(ctx, q, p.Name()).Scan(&version, &age)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: no store running inline projection %s has recorded it in schema %s; start one with it in postgres.Config.Inline", ErrUnknownProjection, p.Name(), store.Schema())
	}
	if err != nil {
		return fmt.Errorf("read the recorded inline projections: %w", err)
	}
	if version != p.Version() {
		return fmt.Errorf("%w: %s: the schema records version %d, this process has version %d; processes with version %d write its tables: "+
			"rebuild from a binary with that version, or finish the deploy (the newest version started wins)", ErrInlineVersion, p.Name(), version, p.Version(), version)
	}
	if d := time.Duration(age * float64(time.Second)); d < grace {
		return fmt.Errorf("%w: %s: version %d was recorded %v ago; wait until %v have passed, so stores with older versions have seen it and stopped appending",
			ErrInlineVersion, p.Name(), version, d.Round(time.Millisecond), grace)
	}
	return nil
}

// beginInline checks what a rebuild needs and starts it, or finds where the
// rebuild in progress stopped: the recorded rebuild (want, or the active one
// of the projection, else a new record), its live tables, and its cursor
// (the start for a new one, whose shadow tables it creates).
func beginInline(ctx context.Context, store *postgres.Store, p *projection.Inline, opts InlineOptions, shadow string, want int64) (inlineStart, error) {
	name := p.Name()
	var st inlineStart
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if err := checkInlineVersion(ctx, tx, store, p, opts.Grace, false); err != nil {
			return err
		}
		if err := checkPruned(ctx, tx, store, name, p.EventTypes()); err != nil {
			return err
		}
		var async bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+store.Table("projector_projections")+` WHERE name = $1)`, name).Scan(&async); err != nil {
			return fmt.Errorf("rebuild inline %s: %w", name, err)
		}
		if async {
			return fmt.Errorf("%w: inline %s: an async projection has the same name, and rebuilds are recorded by name; rename one", ErrNotRebuildable, name)
		}
		rels := map[string]string{}
		for _, t := range opts.Tables {
			var q string
			err := tx.QueryRow(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, t).Scan(&q)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: inline %s: table %q does not exist (or is not a table)", ErrNotRebuildable, name, t)
			}
			if err != nil {
				return fmt.Errorf("rebuild inline %s: resolve table %q: %w", name, t, err)
			}
			_, rel, _ := strings.Cut(q, ".")
			if other, dup := rels[rel]; dup {
				return fmt.Errorf("%w: inline %s lists %s and %s: tables need distinct names to share a shadow schema", ErrNotRebuildable, name, other, q)
			}
			rels[rel] = q
			st.live = append(st.live, q)
		}

		// The rebuild in progress, if any (requested, or interrupted).
		var mode, schema string
		var version int
		var recorded []string
		err := tx.QueryRow(ctx, `SELECT id, mode, version, tables, coalesce(shadow_schema, '') FROM `+store.Table("projector_rebuilds")+`
			WHERE name = $1 AND status IN ('building', 'ready') FOR UPDATE`, name).Scan(&st.id, &mode, &version, &recorded, &schema)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && want != 0:
			return fmt.Errorf("%w: rebuild %d of inline %s ended (switched or cancelled)", ErrNotActive, want, name)
		case errors.Is(err, pgx.ErrNoRows):
			target, total, err := logEnd(ctx, tx, store, name)
			if err != nil {
				return err
			}
			if st.id, err = insertRow(ctx, tx, store, name, decl{version: p.Version(), tables: st.live}, Options{Mode: BlueGreen}, target, total); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("rebuild inline %s: read its rebuilds: %w", name, err)
		case want != 0 && st.id != want:
			return fmt.Errorf("%w: rebuild %d of inline %s ended; rebuild %d replaced it", ErrNotActive, want, name, st.id)
		case mode != string(BlueGreen) || schema != shadow:
			return fmt.Errorf("%w: rebuild %d of %s is not an inline rebuild; cancel it first", ErrActive, st.id, name)
		case version != p.Version():
			return fmt.Errorf("%w: rebuild %d of inline %s builds version %d, this process has version %d; carry it on from a binary with that version, or cancel it",
				ErrActive, st.id, name, version, p.Version())
		case len(recorded) > 0 && !slices.Equal(recorded, st.live):
			return fmt.Errorf("%w: rebuild %d of inline %s rebuilds tables %s, not %s; carry it on with those, or cancel it",
				ErrActive, st.id, name, strings.Join(recorded, ", "), strings.Join(st.live, ", "))
		default:
			// Started already? Its cursor and shadow tables are committed
			// together, batch by batch: carry on from there.
			err := tx.QueryRow(ctx, `SELECT c.cursor_tx_id, c.cursor_seq FROM `+store.Table("projector_consumers")+` c
				WHERE c.name = $1 AND c.instance_id = $2 AND c.shadow_schema = $3 AND to_regnamespace($3) IS NOT NULL FOR UPDATE`,
				name, projection.RebuildInstance, shadow).Scan(&st.cursor.TxID, &st.cursor.Seq)
			if err == nil {
				st.resumed = true
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("rebuild inline %s: read its cursor: %w", name, err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET tables = $2, shadow_schema = $3 WHERE id = $1`,
			st.id, st.live, shadow); err != nil {
			return fmt.Errorf("rebuild inline %s: record: %w", name, err)
		}
		// A leftover of a rebuild that ended uncleanly: nothing live.
		if _, err := tx.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{shadow}.Sanitize()+` CASCADE`); err != nil {
			return fmt.Errorf("rebuild inline %s: drop a leftover shadow schema: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{shadow}.Sanitize()); err != nil {
			return fmt.Errorf("rebuild inline %s: create the shadow schema %s: %w", name, shadow, err)
		}
		for _, t := range st.live {
			_, rel, _ := strings.Cut(t, ".")
			if err := copyTable(ctx, tx, name, t, shadow, rel); err != nil {
				return err
			}
		}
		if err := grantSchemaLike(ctx, tx, name, st.live[0], shadow); err != nil {
			return err
		}
		// Its cursor, where `status` shows it (NAME, __rebuild__).
		if _, err := tx.Exec(ctx, `INSERT INTO `+store.Table("projector_consumers")+` AS c
				(name, instance_id, cursor_tx_id, cursor_seq, version, shadow_schema) VALUES ($1, $2, '0', 0, $3, $4)
			ON CONFLICT (name, instance_id) DO UPDATE SET cursor_tx_id = '0', cursor_seq = 0, version = excluded.version,
				shadow_schema = excluded.shadow_schema, status = 'idle', attempts = 0, last_error = NULL, last_error_at = NULL,
				processed = 0, updated_at = now()`,
			name, projection.RebuildInstance, p.Version(), shadow); err != nil {
			return fmt.Errorf("rebuild inline %s: record its cursor: %w", name, err)
		}
		// A prune that committed since the first check (while this waited
		// to copy a table, say) deleted events the replay would miss.
		return recheckPruned(ctx, tx, store, name, p.EventTypes())
	})
	return st, err
}

// switchInline is one attempt at the switch: lock the live tables, check
// the version fence again, apply what committed since cursor, swap. It
// returns the events applied, the time waited for the lock, the time it
// was held and the part of that spent catching up.
//
// Why it is exact: an append inserts its events and then runs the inline
// handlers in its own transaction, and a handler's first statement on a
// live table takes a lock that lasts until that transaction ends. Once
// ACCESS EXCLUSIVE is granted, every transaction that touched the live
// tables has therefore ended: if it committed, its events are visible to
// the read below (read committed: a new snapshot per statement) and are
// applied to the shadow; the read takes every committed event after the
// cursor, without the gap-safe bound, because a transaction still running
// now has not touched the live tables, and will only touch them after the
// switch — by name, so it writes the new tables, and its events must not be
// applied here. Events before the cursor were all final when read.
func switchInline(ctx context.Context, store *postgres.Store, p *projection.Inline, opts InlineOptions, id int64, shadow, old string,
	live []string, tables map[string]string, cursor projector.Position,
) (applied int, wait, held, catchUp time.Duration, err error) {
	idents := make([]string, len(live))
	for i, t := range live {
		idents[i] = qualified(t)
	}
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The record, then the shard, as Cancel locks them: a cancel either
	// waits for the switch or is seen here.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+store.Table("projector_rebuilds")+` WHERE id = $1 FOR UPDATE`, id); err != nil {
		return 0, 0, 0, 0, err
	}
	if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: p.Name(), Instance: projection.RebuildInstance}); err != nil {
		return 0, 0, 0, 0, err
	}
	if err := stillBuilding(ctx, tx, store, id); err != nil {
		return 0, 0, 0, 0, err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, opts.LockTimeout.Milliseconds())); err != nil {
		return 0, 0, 0, 0, err
	}
	start := time.Now()
	_, err = tx.Exec(ctx, `LOCK TABLE `+strings.Join(idents, ", ")+` IN ACCESS EXCLUSIVE MODE`)
	granted := time.Now()
	wait = granted.Sub(start)
	if err != nil {
		return 0, wait, 0, 0, err
	}
	if err := checkInlineVersion(ctx, tx, store, p, 0, true); err != nil {
		return 0, wait, 0, 0, err
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1 || ', ' || current_setting('search_path'), true)`,
		pgx.Identifier{shadow}.Sanitize()); err != nil {
		return 0, wait, 0, 0, err
	}
	// Archived events after the cursor (none, unless streams were archived
	// with no consumer registered at all): read with the hot log.
	archived, err := store.ArchivedAfter(ctx, tx, cursor)
	if err != nil {
		return 0, wait, 0, 0, err
	}
	const limit = 1000
	for {
		events, err := readCommitted(ctx, tx, store, cursor, p.EventTypes(), limit, archived)
		if err != nil {
			return applied, wait, 0, 0, err
		}
		if err := projection.ReplayInline(ctx, tx, p, events, tables); err != nil {
			return applied, wait, 0, 0, fmt.Errorf("catch-up: %w", err)
		}
		applied += len(events)
		if len(events) < limit {
			break
		}
		cursor = events[len(events)-1].Position
	}
	catchUp = time.Since(granted)
	stmts := []string{`CREATE SCHEMA ` + pgx.Identifier{old}.Sanitize()}
	for _, t := range live {
		schema, rel, _ := strings.Cut(t, ".")
		stmts = append(stmts,
			`ALTER TABLE `+pgx.Identifier{schema, rel}.Sanitize()+` SET SCHEMA `+pgx.Identifier{old}.Sanitize(),
			`ALTER TABLE `+pgx.Identifier{shadow, rel}.Sanitize()+` SET SCHEMA `+pgx.Identifier{schema}.Sanitize())
	}
	stmts = append(stmts, `DROP SCHEMA `+pgx.Identifier{shadow}.Sanitize())
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			return applied, wait, 0, 0, fmt.Errorf("%s: %w", q, err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2`,
		p.Name(), projection.RebuildInstance); err != nil {
		return applied, wait, 0, 0, fmt.Errorf("remove the rebuild's cursor: %w", err)
	}
	// switch_ms: the lock so far; the commit adds little.
	if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET status = 'switched', old_schema = $2, finished_at = now(),
		switch_ms = $3 WHERE id = $1`, id, old, float64(time.Since(granted).Microseconds())/1000); err != nil {
		return applied, wait, 0, 0, fmt.Errorf("record the switch: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return applied, wait, 0, 0, err
	}
	return applied, wait, time.Since(granted), catchUp, nil
}

// readCommitted reads every committed event of types after cursor, in log
// order, with no gap-safe bound: see switchInline for why that is right
// under the switch's lock, and wrong anywhere else.
func readCommitted(ctx context.Context, tx pgx.Tx, store *postgres.Store, after projector.Position, types []string, limit int, archived bool) ([]projector.Event, error) {
	const columns = `e.tx_id, e.seq, e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type,
			e.schema_version, e.data, e.correlation_id, e.causation_id, e.actor, e.headers, e.recorded_at, e.envelope`
	from := store.Table("projector_events")
	if archived {
		from = `(SELECT ` + columns + ` FROM ` + from + ` e UNION ALL SELECT ` + columns + ` FROM ` + store.Table("projector_events_archive") + ` e)`
	}
	rows, err := tx.Query(ctx, `SELECT `+columns+`
		FROM `+from+` e
		WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.type = ANY($3::text[])
		ORDER BY e.tx_id, e.seq LIMIT $4`, after.TxID, after.Seq, types, limit)
	if err != nil {
		return nil, fmt.Errorf("read the log after %s: %w", after, err)
	}
	defer rows.Close()
	var out []projector.Event
	reg := store.Registry()
	for rows.Next() {
		var (
			txID                       uint64
			seq, version               int64
			id, correlation            uuid.UUID
			causation                  *uuid.UUID
			tenant, sType, sID, typ, a string
			schemaVersion              int
			data, headers, envelope    []byte
			at                         time.Time
		)
		if err := rows.Scan(&txID, &seq, &id, &tenant, &sType, &sID, &version, &typ, &schemaVersion, &data, &correlation, &causation, &a, &headers, &at, &envelope); err != nil {
			return nil, fmt.Errorf("read the log after %s: %w", after, err)
		}
		if envelope != nil { // kept apart from the payload (migration 29)
			if data, err = projector.AttachEnvelope(data, envelope); err != nil {
				stream := projector.StreamRef{Tenant: tenant, Type: sType, ID: sID}
				return nil, fmt.Errorf("event %s (%s v%d of %s): %w", id, projector.Printable(typ), version, stream, err)
			}
		}
		ev, err := postgres.DecodeEnvelope(&txID, &seq, id, projector.StreamRef{Tenant: tenant, Type: sType, ID: sID}, version, typ,
			schemaVersion, data, correlation, causation, a, headers, at)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the log after %s: %w", after, err)
	}
	// Personal fields open (or read as forgotten) as in every store read.
	if err := store.OpenEvents(ctx, tx, out); err != nil {
		return nil, fmt.Errorf("read the log after %s: %w", after, err)
	}
	for i := range out {
		ev := &out[i] // opened just above, with the store's own registry
		payload, data, version, err := reg.DecodeOpened(ev.Type, ev.SchemaVersion, ev.Data)
		if err != nil {
			return nil, fmt.Errorf("event %s (%s v%d of %s): %w", ev.ID, projector.Printable(ev.Type), ev.SchemaVersion, ev.Stream, err)
		}
		ev.Payload, ev.Data, ev.SchemaVersion = payload, data, version
	}
	return out, nil
}

// isInlineShadow reports whether schema is the shadow schema an inline
// rebuild of name builds in: how an inline rebuild's record (mode
// 'blue-green') is told from an async projection's.
func isInlineShadow(storeSchema, name, schema string) bool {
	shadow, _ := inlineShadowSchema(storeSchema, name)
	return schema != "" && schema == shadow
}
