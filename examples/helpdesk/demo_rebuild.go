package helpdesk

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/schollz/progressbar/v3"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// demoRebuild rolls agent_workload version 2 out blue/green, as a deploy
// would: version 1's dispatcher keeps serving, version 2's builds the new
// model into shadow tables from the start of the log, and the switch swaps
// the tables in one short transaction. It prints the model before and
// after, the rebuild's progress and how long the switch held the tables.
func demoRebuild(ctx context.Context, store *postgres.Store, app *App, out io.Writer, progress bool) error {
	fmt.Fprintf(out, "\n== Rebuild (agent_workload v1 → v2, blue/green, `projector rebuild agent_workload --wait`)\n")
	before, assigned, err := workloadOpen(ctx, store)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "version 1 counts %d open tickets; the ticket summary has %d assigned and open: v1 leaves a reassigned ticket open on its first agent too\n",
		before, assigned)

	v2, err := NewWorkload(app.Types, store.Schema(), 2)
	if err != nil {
		return err
	}
	// The version fence's warnings are the expected course of a deploy
	// here (v2 stands aside on the v1 model until the switch, v1 after it),
	// so only errors reach standard error.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	start := func(p *projection.Async, instance string) (*projection.Dispatcher, error) {
		d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, InstanceID: instance,
			Logger: logger, PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		return d, d.Start(ctx)
	}
	// The old binary, still serving, and the new one, side by side.
	d1, err := start(app.Workload, "demo-v1")
	if err != nil {
		return err
	}
	defer func() { _ = d1.Stop(context.WithoutCancel(ctx)) }()
	d2, err := start(v2, "demo-v2")
	if err != nil {
		return err
	}
	defer func() { _ = d2.Stop(context.WithoutCancel(ctx)) }()

	rb, err := rebuild.Request(ctx, store, v2.Name(), rebuild.Options{Version: 2})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "rebuild %d of %s v%d requested: %d events to replay into shadow tables in schema %s while v1 serves\n",
		rb.ID, rb.Name, rb.Version, rb.TotalEvents, rb.ShadowSchema)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var bar *progressbar.ProgressBar
	if progress {
		bar = progressbar.NewOptions64(max(rb.TotalEvents, 1), progressbar.OptionSetWriter(out),
			progressbar.OptionSetDescription("rebuild "+rb.Name+" v2"), progressbar.OptionShowCount(), progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("events"), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(50*time.Millisecond),
			progressbar.OptionShowElapsedTimeOnFinish())
	}
	var lastLine time.Time
	lastDone := int64(-1)
	final, err := rebuild.Wait(wctx, store, rb.Name, 50*time.Millisecond, func(r rebuild.Rebuild) {
		done := r.TotalEvents - r.Remaining
		switch {
		case bar != nil:
			_ = bar.Set64(done)
		case done != lastDone && (time.Since(lastLine) >= 250*time.Millisecond || !r.Active()):
			lastLine, lastDone = time.Now(), done
			fmt.Fprintf(out, "rebuild %s: %s, %d/%d events (%.0f%%)\n", r.Name, r.Status, done, r.TotalEvents, 100*r.Progress())
		}
	})
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(out)
	}
	if err != nil {
		return fmt.Errorf("demo rebuild: %w", err)
	}
	if final.Status != rebuild.Switched {
		return fmt.Errorf("demo rebuild %d ended %s, want switched", final.ID, final.Status)
	}
	fmt.Fprintf(out, "switched: version 2 is live; the switch held the live tables for %v (readers saw v1, then v2, never a half-built model)\n",
		final.SwitchTook.Round(10*time.Microsecond))

	after, assigned, err := workloadOpen(ctx, store)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "version 2 counts %d open tickets = %d assigned and open in the ticket summary\n", after, assigned)
	if err := printWorkload(ctx, store, out); err != nil {
		return err
	}
	dropped, err := rebuild.DropOld(ctx, store, rb.Name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "version 1's tables, kept in %v until `projector rebuild drop-old agent_workload`, dropped\n", dropped)
	return nil
}

// workloadOpen returns the open tickets the workload model counts and the
// tickets the inline summary has assigned and open.
func workloadOpen(ctx context.Context, store *postgres.Store) (counted, assigned int64, err error) {
	q := func(name string) string { return pgx.Identifier{store.Schema(), name}.Sanitize() }
	err = store.Pool().QueryRow(ctx, `SELECT (SELECT coalesce(sum(open), 0) FROM `+q(WorkloadTable)+`),
		(SELECT count(*) FROM `+q(SummaryTable)+` WHERE status = 'assigned')`).Scan(&counted, &assigned)
	if err != nil {
		return 0, 0, fmt.Errorf("demo rebuild: read the workload: %w", err)
	}
	return counted, assigned, nil
}

func printWorkload(ctx context.Context, store *postgres.Store, out io.Writer) error {
	rows, err := store.Pool().Query(ctx, `SELECT agent, open, closed FROM `+pgx.Identifier{store.Schema(), WorkloadTable}.Sanitize()+` ORDER BY agent`)
	if err != nil {
		return fmt.Errorf("demo rebuild: read the workload: %w", err)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tOPEN\tCLOSED")
	var agent string
	var open, closed int
	if _, err := pgx.ForEachRow(rows, []any{&agent, &open, &closed}, func() error {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", agent, open, closed)
		return nil
	}); err != nil {
		return fmt.Errorf("demo rebuild: read the workload: %w", err)
	}
	return tw.Flush()
}

// dropRebuildLeftovers drops the shadow and old schemas of rebuilds of an
// earlier demo in schema ("<schema>_rebuild_<id>" and "..._old") that a run
// stopped half-way left behind: the next run numbers its rebuilds from 1
// again and would collide with them. Only a schema that holds nothing but
// helpdesk tables is the demo's; any other is left alone.
func dropRebuildLeftovers(ctx context.Context, tx pgx.Tx, schema string) error {
	rows, err := tx.Query(ctx, `SELECT n.nspname FROM pg_namespace n
		WHERE starts_with(n.nspname, $1 || '_rebuild_') AND substr(n.nspname, length($1) + 1) ~ '^_rebuild_[0-9]+(_old)?$'
			AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname NOT LIKE 'helpdesk\_%')
			AND NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid)`, schema)
	if err != nil {
		return fmt.Errorf("find rebuild leftovers of %s: %w", schema, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("find rebuild leftovers of %s: %w", schema, err)
	}
	for _, n := range names {
		if _, err := tx.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`); err != nil {
			return fmt.Errorf("drop rebuild leftover %s: %w", n, err)
		}
	}
	return nil
}
