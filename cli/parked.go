package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// parkedCmd is `parked`: the streams ParkStream consumers parked, and the
// operator's ways out (docs/operations.md, "Parked streams").
func (a *App) parkedCmd() *cobra.Command {
	cmd := group("parked", "List, show, retry and discard the streams park-stream consumers parked")
	cmd.AddCommand(a.parkedListCmd(), a.parkedShowCmd(), a.parkedRetryCmd(), a.parkedDiscardCmd())
	return cmd
}

func (a *App) parkedListCmd() *cobra.Command {
	var f projection.ParkFilter
	cmd := listCmd{
		use:   "list",
		short: "List parked streams (open parks unless --status says otherwise), oldest first",
		long: `List parks, oldest first, filtered by --consumer, --instance, --tenant and --status
(parked by default; resolved, discarded or all). Pages of --limit rows: pass the last
id shown as --after for the next page.`,
		limit: &f.Limit, after: &f.AfterID, status: &f.Status, parks: true,
		run: func(cmd *cobra.Command, asJSON bool) error {
			if err := textFlags(cmd, "consumer", "instance", "tenant"); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				parks, err := projection.ListParks(cmd.Context(), store, f)
				if errors.Is(err, projection.ErrInvalidParkFilter) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
				if len(parks) == 0 {
					if err := knownConsumer(cmd.Context(), store, f.Consumer, "projector_parks"); err != nil {
						return err
					}
				}
				return writeList(a.out, asJSON, parks, "no parks match", func(tw io.Writer) {
					fmt.Fprintln(tw, "ID\tCONSUMER\tINSTANCE\tSTREAM\tFROM\tEVENTS\tSTATUS\tATTEMPTS\tPARKED\tERROR")
					for _, p := range parks {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\tv%d\t%d\t%s\t%d\t%s\t%s\n", p.ID, projector.Printable(p.Consumer),
							projector.Printable(p.Instance), parkStream(p), p.Version, p.Events, parkStatus(p), p.Attempts,
							p.ParkedAt.UTC().Format(time.RFC3339), parkErrorCell(p.Status, p.ResolvedBy, p.Error))
					}
				})
			})
		},
	}.command()
	fl := cmd.Flags()
	fl.StringVar(&f.Consumer, "consumer", "", "only this consumer's")
	fl.StringVar(&f.Instance, "instance", "", "only this instance's (shared shards: "+projection.SharedInstance+")")
	fl.StringVar(&f.Tenant, "tenant", "", "only this tenant's streams")
	return cmd
}

func (a *App) parkedShowCmd() *cobra.Command {
	return showCmd{
		use:   "show ID",
		short: "Show a park and its parked sequence of events, in order",
		args:  oneParkID, parse: parseParkID,
		run: func(cmd *cobra.Command, id int64, asJSON bool) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				// Raw: the stock binary shows a park of the application's
				// types too (it prints each event's stored data anyway).
				p, events, err := projection.GetParkRaw(cmd.Context(), store, id)
				if err != nil {
					return parkNotFound(cmd, err)
				}
				if asJSON {
					if events == nil {
						events = []projector.Event{}
					}
					return writeJSON(a.out, struct {
						projection.Park
						Sequence []projector.Event `json:"sequence"`
					}{p, events})
				}
				w := a.out
				fmt.Fprintf(w, "park %d: %s\n", p.ID, parkStatus(p))
				fmt.Fprintf(w, "consumer:   %s (instance %s)\n", projector.Printable(p.Consumer), projector.Printable(p.Instance))
				fmt.Fprintf(w, "stream:     %s, parked from v%d (%s %s)\n", parkStream(p), p.Version, projector.Printable(p.EventType), p.EventID)
				if p.LastRetriedAt == nil {
					fmt.Fprintf(w, "parked:     %s after %d %s\n", p.ParkedAt.UTC().Format(time.RFC3339), p.Attempts, plural(int64(p.Attempts), "attempt"))
				} else {
					// Attempts counts each retry too: "after 4 attempts" of a
					// stream parked at MaxAttempts 3 and retried once misled.
					fmt.Fprintf(w, "parked:     %s; %d %s in all, its retries included\n", p.ParkedAt.UTC().Format(time.RFC3339), p.Attempts, plural(int64(p.Attempts), "attempt"))
				}
				if p.LiveThrough >= p.Version {
					// Handed over by a blue/green switch: say which events a
					// retry replays (their Emit calls append nothing again).
					fmt.Fprintf(w, "live mark:  v%d (the model before the rebuild applied the stream up to it; a retry replays those events)\n", p.LiveThrough)
				}
				if p.LastRetriedAt != nil {
					fmt.Fprintf(w, "retried:    %s\n", p.LastRetriedAt.UTC().Format(time.RFC3339))
				}
				if p.RetryRequestedAt != nil && p.Status == projection.ParkOpen {
					fmt.Fprintf(w, "requested:  a retry, %s by %s (a running dispatcher with the consumer carries it out)\n",
						p.RetryRequestedAt.UTC().Format(time.RFC3339), projector.Printable(p.ResolvedBy))
				}
				writeParkOutcome(w, p.Status, p.ResolvedAt, p.ResolvedBy, p.Events, "events", p.Error)
				if len(events) > 0 {
					fmt.Fprintf(w, "sequence:   %d events, applied in this order by a retry\n", len(events))
					for _, ev := range events {
						if p.Kind == projection.ParkKindSagaInstance {
							fmt.Fprintf(w, "  %s v%d %s %s %s\n", ev.Stream, ev.Version, projector.Printable(ev.Type), ev.ID, text(string(ev.Data), cellText*2))
							continue
						}
						fmt.Fprintf(w, "  v%d %s %s %s\n", ev.Version, projector.Printable(ev.Type), ev.ID, text(string(ev.Data), cellText*2))
					}
				}
				return nil
			})
		},
	}.command()
}

// Bounds of `parked retry --wait --timeout`.
const (
	minParkWait     = 100 * time.Millisecond
	maxParkWait     = time.Hour
	defaultParkWait = time.Minute
	parkWaitPoll    = 100 * time.Millisecond
)

func (a *App) parkedRetryCmd() *cobra.Command {
	var here, wait bool
	var timeout time.Duration
	var by string
	cmd := &cobra.Command{
		Use:   "retry ID",
		Short: "Apply a parked sequence again, in order, through its consumer's current handlers",
		Long: `Apply a park's whole sequence of events, in order, through its consumer's current
handlers, in one transaction that also marks the park resolved: every parked event is
applied exactly once, and the stream is live again (its later events follow). A retry
that fails applies nothing and keeps the park with the new error (exit 1). Retrying a
park that is resolved or discarded is refused (exit 3).

The handlers are the projection's code: with --here the retry runs in this process,
which must be your application's binary (cli.Config.Wire); without it the request is
recorded and a running dispatcher that has the projection carries it out (check with
` + "`parked list --status all`" + `), or add --wait: the command then follows the park until
the dispatcher has applied the sequence (exit 0) or the retry failed and the stream is
parked again (exit 1, with the new error), for at most --timeout (exit 1; the request
stays for a dispatcher that starts later).`,
		Args: oneParkID,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseParkID(args[0])
			if err != nil {
				return err
			}
			if err := checkParkWait(cmd, here, wait, timeout); err != nil {
				return err
			}
			if by, err = operatorName(by, a.getenv); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				if wait {
					return parkNotFound(cmd, a.retryParkAndWait(cmd, store, id, by, timeout))
				}
				return parkNotFound(cmd, a.retryPark(cmd, store, id, by, here))
			})
		},
	}
	cmd.Flags().BoolVar(&here, "here", false, "run the handlers in this process (your application's binary, cli.Config.Wire)")
	cmd.Flags().BoolVar(&wait, "wait", false, "without --here: wait until a dispatcher has applied the sequence, or the retry failed (exit 1)")
	cmd.Flags().DurationVar(&timeout, "timeout", defaultParkWait, fmt.Sprintf("with --wait: how long to wait (%v to %v)", minParkWait, maxParkWait))
	cmd.Flags().StringVar(&by, "by", "", "who is retrying, for the record (default $USER@host; without $USER the OS user, else the uid)")
	return cmd
}

func (a *App) parkedDiscardCmd() *cobra.Command {
	var by string
	cmd := &cobra.Command{
		Use:   "discard ID",
		Short: "Drop a parked sequence (its events are never applied); recorded with who, when and how many",
		Args:  oneParkID,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseParkID(args[0])
			if err != nil {
				return err
			}
			if by, err = operatorName(by, a.getenv); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				p, err := projection.DiscardPark(cmd.Context(), store, id, by)
				if err != nil {
					return parkNotFound(cmd, err)
				}
				fmt.Fprintf(a.out, "park %d: discarded %d events of %s (recorded as discarded by %s); the stream is live again from its next event\n",
					id, p.Events, parkStream(p), projector.Printable(p.ResolvedBy))
				if p.RetryRequestedAt != nil {
					// Requested without --here, not yet carried out: the
					// operator who asked for it is not told otherwise.
					fmt.Fprintf(a.out, "park %d: this cancelled the retry requested at %s, which no dispatcher had carried out\n",
						id, p.RetryRequestedAt.UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&by, "by", "", "who is discarding, for the record (default $USER@host; without $USER the OS user, else the uid)")
	return cmd
}

// retryPark retries park id on behalf of by: here, through the wired
// consumer's handlers (an async projection or a saga); otherwise by a
// request a running dispatcher carries out.
func (a *App) retryPark(cmd *cobra.Command, store *postgres.Store, id int64, by string, here bool) error {
	ctx := cmd.Context()
	if !here {
		if err := projection.RequestParkRetry(ctx, store, id, by); err != nil {
			return err
		}
		fmt.Fprintf(a.out, "retry of park %d requested; a running dispatcher with the consumer carries it out (or run with --here in your application's binary)\n", id)
		return nil
	}
	p, err := projection.ParkByID(ctx, store, id)
	if err != nil {
		return err
	}
	proj, err := a.consumerByName(store, p.Consumer)
	if err != nil {
		return err
	}
	if proj == nil {
		return usageError{fmt.Errorf("park %d belongs to %s, and this binary has no async projection or saga of that name: run it with your application's binary (cli.Config.Wire), or without --here for a running dispatcher",
			id, projector.Printable(p.Consumer))}
	}
	res, err := projection.RetryPark(ctx, store, proj, id, by, a.logger())
	if err != nil {
		return err
	}
	if !res.Resolved {
		return fmt.Errorf("park %d: retry failed (attempt %d), nothing applied, still parked: %s", id, res.Attempts, text(res.Error, lineText))
	}
	fmt.Fprintf(a.out, "park %d: applied its %d events in order and resolved; %s is live again\n", id, res.Events, parkStream(p))
	return nil
}

// consumerByName returns the wired consumer name: an async projection, or
// a saga's consumer built on store; nil when the binary has neither.
func (a *App) consumerByName(store *postgres.Store, name string) (*projection.Async, error) {
	w, err := a.wiring()
	if err != nil {
		return nil, err
	}
	for _, p := range w.Async {
		if p.Name() == name {
			return p, nil
		}
	}
	if w.Sagas == nil {
		return nil, nil
	}
	defs, err := w.Sagas(store)
	if err != nil {
		return nil, fmt.Errorf("wire sagas: %w", err)
	}
	for _, s := range defs {
		if s != nil && s.Name() == name {
			return s.Projection(store)
		}
	}
	return nil, nil
}

// oneParkID accepts exactly one argument, with the usage exit code.
func oneParkID(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{fmt.Errorf("want one park id, got %d arguments", len(args))}
	}
	return nil
}

// parseParkID reads a park id: a positive integer.
func parseParkID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, usageError{fmt.Errorf("park id %s: want a positive integer", quoted(s))}
	}
	return id, nil
}

// operatorName is who acts, for a park's record: --by, else
// defaultOperator's user@host.
func operatorName(by string, getenv func(string) string) (string, error) {
	if by == "" {
		host, _ := os.Hostname()
		by = defaultOperator(getenv, user.Current) + "@" + cmp.Or(host, "unknown")
	}
	if projection.ValidateOperator(by) != nil {
		// The library words it as a refused transition (its sentinel);
		// on a command line it is a bad flag.
		return "", usageError{fmt.Errorf("--by %s: want who acts, as printable text (valid UTF-8, no control characters, at most %d bytes)", projector.Printable(by), projector.MaxNameLength)}
	}
	return by, nil
}

// defaultOperator names the user running the command when --by is not
// given: $USER, else the OS account's name (os/user: a shell without $USER,
// cron, a container's exec), else "uid N".
func defaultOperator(getenv func(string) string, current func() (*user.User, error)) string {
	if u := getenv("USER"); u != "" {
		return u
	}
	if u, err := current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid " + strconv.Itoa(os.Getuid())
}

// writeParkOutcome ends `parked show` and `relay parked show`: an open
// park's error, or what closed it (a retry that applied the sequence, or a
// discard) and, labelled as such, the error it had before.
func writeParkOutcome(w io.Writer, status string, closedAt *time.Time, by string, n int, unit, lastErr string) {
	switch {
	case closedAt == nil:
		fmt.Fprintf(w, "error:      %s\n", text(lastErr, lineText))
		return
	case status == projection.ParkResolved:
		fmt.Fprintf(w, "resolved:   %s by %s: a retry applied its %d %s in order\n", closedAt.UTC().Format(time.RFC3339), projector.Printable(by), n, unit)
	default:
		fmt.Fprintf(w, "%s:  %s by %s: its %d %s were dropped, never applied\n", status, closedAt.UTC().Format(time.RFC3339), projector.Printable(by), n, unit)
	}
	fmt.Fprintf(w, "last error: %s (before it was %s; kept for the record)\n", text(lastErr, lineText), status)
}

// parkErrorCell is a park's ERROR cell in a list: an open park's error, or
// for a closed one who closed it and, labelled, the error it had before.
func parkErrorCell(status, by, lastErr string) string {
	if status == projection.ParkOpen {
		return text(lastErr, 80)
	}
	return status + " by " + text(by, cellText) + "; last error before: " + text(lastErr, 80)
}

func parkStream(p projection.Park) string {
	if p.Kind == projection.ParkKindSagaInstance {
		return p.What()
	}
	return projector.Printable(p.StreamType) + "/" + projector.Printable(p.StreamID) + " (tenant " + projector.Printable(p.Tenant) + ")"
}

func parkStatus(p projection.Park) string {
	if p.RetryRequestedAt != nil && p.Status == projection.ParkOpen {
		return "parked, retry requested"
	}
	return p.Status
}
