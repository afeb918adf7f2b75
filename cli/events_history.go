package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// exportCmd is `events export`: the log as a history file.
func (a *App) exportCmd() *cobra.Command {
	var opts postgres.ExportOptions
	var from, to, after, output string
	var redact []string
	cmd := &cobra.Command{
		Use:   "export [--stream-type T ...] [--tenant T] [--from TIME] [--to TIME] [--after POSITION] [--include-archived] [--redact FIELD.PATH ...] [-o FILE]",
		Short: "Write the event log, or part of it, as a history file (JSON Lines)",
		Long: `export writes events in log order as a history file: a header line, then one
JSON object per event with its stream, version, type, schema version, id, recording
time, payload (as stored, not upcast) and metadata (docs/history.md). ` + "`events import`" + `
reads the same format; an export imported into an empty schema writes the same log.

It reads in pages (memory stays flat whatever the size of the log) and only events
of transactions that had finished when it started; if a transaction older than the
newest event is still open, it waits for it to end first.

--stream-type and --tenant keep the events of those stream types and that tenant;
--from and --to (RFC 3339 times) keep events recorded at or after --from and before
--to. --after starts after a log position: the one an earlier export printed, so a
series of exports holds every event once. --include-archived also writes the events of
archived streams (` + "`streams archive`" + `), each at its place in log order. --redact replaces a payload field, in every event that has it, with an empty
value of its kind ("" for a string, 0 for a number): dot-separated field names from
the payload's top level, without a stream or event type (email, or customer.email for
the email of a customer object), applied to each element of an array on the way. The
summary counts the events each path redacted, and a path that redacted nothing is
warned of on standard error. Without -o (or with -o -) the file goes to standard
output and the summary to standard error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.From, err = parseTimeFlag("--from", from); err != nil {
				return err
			}
			if opts.To, err = parseTimeFlag("--to", to); err != nil {
				return err
			}
			if after != "" {
				if opts.After, err = projector.ParsePosition(after); err != nil {
					return usageError{fmt.Errorf("--after: %w (the position an earlier export printed)", err)}
				}
			}
			if !opts.From.IsZero() && !opts.To.IsZero() && !opts.From.Before(opts.To) {
				return usageError{fmt.Errorf("--from %s is not before --to %s", from, to)}
			}
			for _, n := range append(append([]string(nil), opts.StreamTypes...), opts.Tenant) {
				if err := projector.ValidText(n); err != nil || len(n) > projector.MaxNameLength {
					return usageError{fmt.Errorf("--stream-type or --tenant %s: not a name (valid UTF-8 without NUL, at most %d bytes)", projector.Printable(n), projector.MaxNameLength)}
				}
			}
			var redactor *postgres.FieldRedactor
			if len(redact) > 0 {
				if redactor, err = postgres.NewFieldRedactor(redact); err != nil {
					return usageError{fmt.Errorf("--redact: %w", err)}
				}
				opts.Redact = redactor.Redact
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				w, summary := a.out, a.out
				if output != "" && output != "-" {
					f, err := os.Create(output)
					if err != nil {
						return printablePathError(err)
					}
					defer f.Close()
					w = f
				} else {
					summary = a.errOut
				}
				res, err := store.Export(cmd.Context(), w, opts)
				if err != nil {
					return err
				}
				if f, ok := w.(*os.File); ok {
					if err := f.Close(); err != nil {
						return fmt.Errorf("write %s: %w", projector.Printable(output), err)
					}
				}
				fmt.Fprintf(summary, "exported %d %s, up to log position %s (`%s events export --after %[3]s` exports what comes after)\n",
					res.Events, plural(res.Events, "event"), cursor(res.Horizon), cmd.Root().Name())
				if redactor != nil {
					a.reportRedacted(summary, redactor.Matched(), res.Events)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringSliceVar(&opts.StreamTypes, "stream-type", nil, "only events of this stream type (repeatable)")
	cmd.Flags().StringVar(&opts.Tenant, "tenant", "", "only this tenant's events")
	cmd.Flags().StringVar(&from, "from", "", "only events recorded at or after this time (RFC 3339)")
	cmd.Flags().StringVar(&to, "to", "", "only events recorded before this time (RFC 3339)")
	cmd.Flags().StringVar(&after, "after", "", "only events after this log position (txid/seq), the one an earlier export printed")
	cmd.Flags().BoolVar(&opts.IncludeArchived, "include-archived", false, "also export the events of archived streams, in log order")
	cmd.Flags().StringArrayVar(&redact, "redact", nil, "replace this payload field (dot path from the payload's top level, e.g. email or customer.email) with an empty value (repeatable)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "write the file here (default, or -: standard output)")
	return cmd
}

// reportRedacted adds to an export's summary how many events each --redact
// path redacted, and warns on standard error of each path that redacted
// nothing although events were exported. It is a warning, not an error: a
// list of every personal path of an application (what the docs suggest
// feeding --redact) meets exports, increments after --after or of one
// stream type, that hold none of some of them, and those must not fail;
// but a misspelt path, or one that starts with the stream type, leaves
// the field in clear in a file meant to be anonymised, so it must not pass
// unseen either.
func (a *App) reportRedacted(summary io.Writer, matched []postgres.PathCount, exported int64) {
	fmt.Fprint(summary, "redacted:")
	for i, m := range matched {
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(summary, "%s %s in %d %s", sep, projector.Printable(m.Path), m.Events, plural(m.Events, "event"))
	}
	fmt.Fprintln(summary)
	if exported == 0 {
		return
	}
	for _, m := range matched {
		if m.Events == 0 {
			fmt.Fprintf(a.errOut, "warning: --redact %s redacted nothing: no exported event has that payload field, and a value under another path is in the file in clear (a path starts at the payload's top level, without a stream or event type: email, customer.email)\n",
				projector.Printable(m.Path))
		}
	}
}

// parseTimeFlag parses an RFC 3339 time; empty is the zero time.
func parseTimeFlag(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, usageError{fmt.Errorf("%s %s: want an RFC 3339 time such as 2026-01-31T00:00:00Z", name, projector.Printable(v))}
	}
	return t, nil
}

// importCmd is `events import`: a history file into the log.
func (a *App) importCmd() *cobra.Command {
	var opts postgres.ImportOptions
	cmd := &cobra.Command{
		Use:   "import [--batch-size N] [--without-inline] FILE|-",
		Short: "Append the events of a history file (JSON Lines) to the log, with COPY",
		Long: `import reads a history file (what ` + "`events export`" + ` writes, docs/history.md; - reads
standard input) and appends its events with PostgreSQL's COPY, --batch-size events
per transaction. Every event is checked first: its type defined by this application
and its payload valid, its id not repeated, its stream's versions contiguous and
continuing the version the stream has in the log. A bad line stops the import with
its line number; nothing of its batch is written, earlier batches stay.

Run again after an interruption, import skips the events already in the log (the
same id at the same stream and version) and continues; it never writes an event
twice. Imported events get log positions after everything committed before them,
and consumers process them like appended ones.

The application's inline projections are applied to each batch, as appends apply
them; --without-inline skips them (faster), and they must then be rebuilt
(` + "`rebuild`" + `) before their read models hold the imported events.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("want one history file, or - for standard input; got %d arguments (usage: %s)", len(args), cmd.UseLine())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.BatchSize < 1 || opts.BatchSize > postgres.MaxImportBatchSize {
				return usageError{fmt.Errorf("--batch-size %d: want 1 to %d", opts.BatchSize, postgres.MaxImportBatchSize)}
			}
			var in io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return usageError{printablePathError(err)}
				}
				defer f.Close()
				in = f
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				start := time.Now()
				last := start
				opts.Progress = func(r postgres.ImportResult) {
					if time.Since(last) >= 5*time.Second {
						last = time.Now()
						fmt.Fprintf(a.errOut, "… %d events read, %d imported\n", r.Lines, r.Imported)
					}
				}
				res, err := store.Import(cmd.Context(), in, opts)
				if err != nil && cmd.Context().Err() != nil {
					// Ctrl-C or SIGTERM: the batches committed stay, and
					// running the import again goes on after them.
					return fmt.Errorf("import interrupted after %d events in %d committed %s; run it again to go on (the events already in the log are skipped)",
						res.Imported, res.Batches, batches(res.Batches))
				}
				if err != nil {
					return fmt.Errorf("%w (%d events imported before it, in %d committed %s)", err, res.Imported, res.Batches, batches(res.Batches))
				}
				secs := max(time.Since(start).Seconds(), 1e-3)
				fmt.Fprintf(a.out, "imported %d %s (%d already in the log, skipped) in %d %s, %.0f events/s\n",
					res.Imported, plural(res.Imported, "event"), res.Skipped, res.Batches, batches(res.Batches), float64(res.Lines)/secs)
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&opts.BatchSize, "batch-size", postgres.DefaultImportBatchSize, fmt.Sprintf("events per transaction (1 to %d)", postgres.MaxImportBatchSize))
	cmd.Flags().BoolVar(&opts.WithoutInline, "without-inline", false, "do not apply the application's inline projections (rebuild them afterwards)")
	return cmd
}

func batches(n int) string {
	if n == 1 {
		return "batch"
	}
	return "batches"
}
