package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector/projection"
)

// listCmd describes a `list` of parks or dead letters (`parked`,
// `dead-letters`, `relay parked`, `relay dead-letters`): they page and
// filter by status alike, so their flags are declared and checked in one
// place, and each command adds only its own filters and output.
type listCmd struct {
	use, short, long string
	// limit, after and status receive --limit, --after and --status (the
	// latter as a filter takes it: "" for all).
	limit  *int
	after  *int64
	status *string
	// parks: --status takes a park's statuses (parked by default), else a
	// dead letter's (open by default).
	parks bool
	// subscription, if not nil, receives --subscription (required): a
	// JetStream claims consumer's listing.
	subscription *string
	// run lists, once the shared flags are checked; asJSON is -o json.
	run func(cmd *cobra.Command, asJSON bool) error
}

// command builds the command: -o, --limit, --after, --status and
// --subscription are checked, in that order, as usage errors (exit 2)
// before run.
func (l listCmd) command() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   l.use,
		Short: l.short,
		Long:  l.long,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			if *l.limit < 1 || *l.limit > 10_000 {
				return usageError{fmt.Errorf("--limit %d: want 1 to 10000", *l.limit)}
			}
			if *l.after < 0 {
				return usageError{fmt.Errorf("--after %d: want an id (0 for the start)", *l.after)}
			}
			read := statusFlag
			if l.parks {
				read = parkStatusFlag
			}
			if *l.status, err = read(*l.status); err != nil {
				return err
			}
			if err := checkSubscription(l.subscription); err != nil {
				return err
			}
			return l.run(cmd, asJSON)
		},
	}
	def, statuses := projection.DeadLetterOpen, "open, resolved, discarded or all"
	if l.parks {
		def, statuses = projection.ParkOpen, "parked, resolved, discarded or all"
	}
	fl := cmd.Flags()
	fl.StringVar(l.status, "status", def, statuses)
	fl.IntVar(l.limit, "limit", 100, "rows per page (1..10000)")
	fl.Int64Var(l.after, "after", 0, "the last id of the previous page")
	fl.StringVarP(&format, "output", "o", "table", "output format: table or json")
	subscriptionFlag(cmd, l.subscription)
	return cmd
}

// subscriptionFlag declares --subscription into s, unless s is nil.
func subscriptionFlag(cmd *cobra.Command, s *string) {
	if s != nil {
		cmd.Flags().StringVar(s, "subscription", "", "the consumer's subscription (required)")
	}
}

// checkSubscription checks the --subscription s holds, unless s is nil.
func checkSubscription(s *string) error {
	if s == nil {
		return nil
	}
	return validateSubscription(*s, false)
}

// parkStatusFlag reads a park --status flag (parked, resolved, discarded
// or all) into a status filter, "" for all: the dispatcher's parks and the
// JetStream claims consumer's have the same statuses and the same flag.
func parkStatusFlag(s string) (string, error) {
	if s == "all" {
		return "", nil
	}
	if s == "" || projection.ValidateParkStatus(s) != nil {
		return "", usageError{fmt.Errorf("--status %s: want parked, resolved, discarded or all", quoted(s))}
	}
	return s, nil
}

// showCmd describes a `show ID` of a park or a dead letter.
type showCmd struct {
	use, short string
	// args checks the arguments' count, parse reads the id: a park's or
	// a dead letter's, each with its own words.
	args  cobra.PositionalArgs
	parse func(string) (int64, error)
	// subscription, if not nil, receives --subscription (required): a
	// JetStream claims consumer's park or dead letter.
	subscription *string
	// run shows id, once -o and the id are checked; asJSON is -o json.
	run func(cmd *cobra.Command, id int64, asJSON bool) error
}

// command builds the command: -o, the id and --subscription are checked,
// in that order, as usage errors (exit 2) before run.
func (s showCmd) command() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   s.use,
		Short: s.short,
		Args:  s.args,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			id, err := s.parse(args[0])
			if err != nil {
				return err
			}
			if err := checkSubscription(s.subscription); err != nil {
				return err
			}
			return s.run(cmd, id, asJSON)
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	subscriptionFlag(cmd, s.subscription)
	return cmd
}

// pagedIDs returns the id of every row list pages through, in id order:
// list(after) returns at most pageSize rows whose id is larger than after,
// and a shorter page is the last.
func pagedIDs[T any](pageSize int, list func(after int64) ([]T, error), id func(T) int64) ([]int64, error) {
	var ids []int64
	var after int64
	for {
		page, err := list(after)
		if err != nil {
			return nil, err
		}
		for _, row := range page {
			ids = append(ids, id(row))
		}
		if len(page) < pageSize {
			return ids, nil
		}
		after = id(page[len(page)-1])
	}
}
