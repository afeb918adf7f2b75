package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/postgres"
)

// verifyDocText is how much of a differing document verify shows.
const verifyDocText = 500

// maxVerifySample bounds --sample: beyond it a sample is no cheaper than
// comparing everything.
const maxVerifySample = 10_000_000

func (a *App) searchCmd() *cobra.Command {
	cmd := group("search", "Work with the indexes of search projections (see docs/search.md)")
	cmd.AddCommand(a.searchVerifyCmd(), a.searchReindexCmd())
	return cmd
}

// searchProjection finds the search projection name among the wired
// consumers.
func (a *App) searchProjection(name string) (*search.Projection, error) {
	w, err := a.wiring()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, as := range w.Async {
		if sp, ok := search.ProjectionOf(as); ok {
			if sp.Name() == name {
				return sp, nil
			}
			names = append(names, sp.Name())
		}
	}
	slices.Sort(names)
	known := "this binary wires none"
	if len(names) > 0 {
		known = "this binary wires " + strings.Join(names, ", ")
	}
	return nil, usageError{fmt.Errorf("no search projection \"%s\" (%s)", text(name, cellText), known)}
}

func (a *App) searchReindexCmd() *cobra.Command {
	var batch int
	cmd := &cobra.Command{
		Use:   "reindex NAME",
		Short: "Rebuild a Meilisearch index from the log beside the live one and swap them",
		Long: `reindex NAME rebuilds the index of the search projection NAME from the log without
leaving searches without an answer: it builds a new index beside the live one up to
the consumer's cursor while live indexing goes on, holds live indexing (disables the
shard) while the new index catches up to the same cursor, swaps the two atomically
(Meilisearch's swap-indexes), deletes the old one and resumes live indexing.
A partitioned projection is reindexed per partition: each event up to its own
partition's cursor, every partition held while the new index catches up.

For a PostgreSQL index use 'rebuild NAME' (blue/green) instead: refused here.
Exit codes: 0 reindexed, 1 failed, 2 bad command line, 3 refused (not a swapping
backend, the consumer or one of its partitions is dead or disabled, or its
partitions were split or merged meanwhile).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("search reindex needs the search projection's NAME")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if batch < 1 || batch > 100_000 {
				return usageError{fmt.Errorf("--batch %d: want 1 up to 100000", batch)}
			}
			p, err := a.searchProjection(args[0])
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				r, err := search.Reindex(cmd.Context(), store, p, batch)
				if errors.Is(err, search.ErrNotReindexable) {
					return refusedError{err}
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "reindexed search projection %s (%s index %q): %d events replayed; built to %s while live, swapped at %s\n",
					p.Name(), p.SearchBackend().Kind(), p.SearchIndex().Name, r.Events, cursor(r.Built), cursor(r.Swapped))
				if len(r.Partitions) > 0 {
					fmt.Fprintf(a.out, "partitioned: swapped at partition cursors %s (built and swapped above are the lowest)\n", partitionCursors(r.Partitions))
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&batch, "batch", search.DefaultReindexBatch, "events replayed per write to the new index")
	return cmd
}

func (a *App) searchVerifyCmd() *cobra.Command {
	var sample, show, pageSize int
	cmd := &cobra.Command{
		Use:   "verify NAME",
		Short: "Compare a search projection's index with what the log says it should hold",
		Long: `verify NAME replays the events of the search projection NAME up to its consumer's
cursor, in memory, through the projection's handlers (compiled into this binary),
and compares the documents that gives with the ones its index holds: missing,
extra and differing documents are listed. --sample N compares the contents of N
documents picked at random instead of all; every missing or extra document is
found whatever the sample, and any is a failure. It works through the documents in pages of --page-size
(by a hash of tenant and id), replaying the log once per page, so its memory is
bounded by a page, not by the index. On a partitioned projection each document is
expected as of the cursor of its own stream's partition, and every partition's cursor
is printed. The consumer may keep running: verify reads again while a batch is in
flight, and a page that still differs after its attempts is read once more holding the
consumer (a pause of about one listing of the page, docs/search.md).

Exit codes: 0 the index holds what the log says, 1 it differs (or the check
failed), 2 bad command line.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("search verify needs the search projection's NAME")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if sample < 0 || sample > maxVerifySample {
				return usageError{fmt.Errorf("--sample %d: want 0 (every document) up to %d", sample, maxVerifySample)}
			}
			if show < 0 || show > 1_000_000 {
				return usageError{fmt.Errorf("--show %d: want 0 up to 1000000", show)}
			}
			if pageSize < 1 || pageSize > maxVerifySample {
				return usageError{fmt.Errorf("--page-size %d: want 1 up to %d documents", pageSize, maxVerifySample)}
			}
			p, err := a.searchProjection(args[0])
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				r, err := search.Verify(cmd.Context(), store, p, search.VerifyOptions{Sample: sample, PageSize: pageSize})
				if err != nil {
					return err
				}
				idx := p.SearchIndex()
				at := "cursor " + cursor(r.Cursor)
				if len(r.Partitions) > 0 {
					// Partitioned: each document was expected as of its
					// stream's partition's cursor.
					at = "partition cursors " + partitionCursors(r.Partitions)
				}
				fmt.Fprintf(a.out, "search projection %s (%s index %q) at %s: %d events replayed; %d documents expected, %d indexed, %d compared\n",
					p.Name(), p.SearchBackend().Kind(), idx.Name, at, r.Events, r.Expected, r.Indexed, r.Compared)
				if r.Moved {
					fmt.Fprintln(a.out, "note: the consumer kept moving while the index was read; differences may include batches in flight")
				}
				for i, d := range r.Differences {
					if i == show {
						fmt.Fprintf(a.out, "... and %d more\n", len(r.Differences)-show)
						break
					}
					doc, want, got := projector.Printable(d.Tenant)+"/"+projector.Printable(d.ID),
						projector.PrintableText(string(d.Want), verifyDocText), projector.PrintableText(string(d.Got), verifyDocText)
					switch d.Kind {
					case search.Missing:
						fmt.Fprintf(a.out, "missing  %s  log: %s\n", doc, want)
					case search.Extra:
						fmt.Fprintf(a.out, "extra    %s  index: %s\n", doc, got)
					default:
						fmt.Fprintf(a.out, "differs  %s  log: %s  index: %s\n", doc, want, got)
					}
				}
				if !r.OK() {
					return fmt.Errorf("search projection %s: the index differs from the log: %s", p.Name(), verifyCounts(r))
				}
				fmt.Fprintln(a.out, "the index holds what the log says")
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&sample, "sample", 0, "compare this many documents picked at random (0: all)")
	cmd.Flags().IntVar(&show, "show", 20, "list at most this many differences")
	cmd.Flags().IntVar(&pageSize, "page-size", search.DefaultVerifyPage, "documents compared per page (memory is bounded by a page; each page replays the log)")
	return cmd
}

// partitionCursors lists a partitioned consumer's cursors as "p/N
// position, …".
func partitionCursors(parts []search.PartitionCursor) string {
	out := make([]string, len(parts))
	for i, pc := range parts {
		out[i] = pc.Partition + " " + cursor(pc.Cursor)
	}
	return strings.Join(out, ", ")
}

// verifyCounts says how a verify report's index differs from the log.
func verifyCounts(r search.VerifyReport) string {
	n := map[search.DiffKind]int{}
	for _, d := range r.Differences {
		n[d.Kind]++
	}
	return fmt.Sprintf("%d documents expected, %d indexed: %d missing, %d extra, %d of %d compared differ",
		r.Expected, r.Indexed, n[search.Missing], n[search.Extra], n[search.Differs], r.Compared)
}

// cancelRebuild is `rebuild cancel NAME`: rebuild.Cancel drops what lives
// in PostgreSQL (the shadow shard and schema); when this binary wires the
// projection and it has an External target (a Meilisearch index), the
// rebuild's shadow index is deleted here too. Without the code a
// dispatcher of the version deletes it when its shadow shard ends.
func (a *App) cancelRebuild(ctx context.Context, store *postgres.Store, name string) error {
	r, err := rebuild.Current(ctx, store, name)
	if err != nil && !errors.Is(err, projector.ErrNotFound) {
		return err
	}
	if err := a.cancelWaiting(ctx, store, name); err != nil { // rebuild_cancel.go
		return err
	}
	w, werr := a.wiring()
	if werr != nil || r.ID == 0 {
		return nil
	}
	for _, as := range w.Async {
		if ext := as.Config().External; as.Name() == name && ext != nil {
			if err := ext.DropShadow(ctx, r.ID); err != nil {
				return fmt.Errorf("rebuild %d of %s cancelled, but deleting its shadow %s index failed (a dispatcher of the version deletes it when it notices): %w", r.ID, name, ext.Kind(), err)
			}
		}
	}
	return nil
}
