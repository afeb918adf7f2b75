package cli

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Bounds of `consumer merge --wait`.
const (
	minMergeWait     = 100 * time.Millisecond
	maxMergeWait     = time.Hour
	defaultMergeWait = 30 * time.Second
)

// partitionFlag resolves --partition against a consumer's partitions:
// "P/N", or "P" when they are all one of N. A number out of range, or a
// partition the consumer does not have, is a usage error listing them.
func partitionFlag(name, flag string, parts []projection.ShardState) (postgres.Segment, error) {
	if len(parts) == 0 {
		return postgres.Segment{}, usageError{fmt.Errorf("--partition: consumer %s is not partitioned", projector.Printable(name))}
	}
	have := make([]string, len(parts))
	sizes := map[int]bool{}
	for i, s := range parts {
		have[i] = fmt.Sprintf("%d/%d", s.Partition, s.Partitions)
		sizes[s.Partitions] = true
	}
	ps, ns, slash := strings.Cut(flag, "/")
	p, err := strconv.Atoi(ps)
	n := parts[0].Partitions
	if slash {
		var nerr error
		n, nerr = strconv.Atoi(ns)
		err = errors.Join(err, nerr)
	} else if len(sizes) > 1 {
		return postgres.Segment{}, usageError{fmt.Errorf("--partition %s: consumer %s has partitions of several sizes (%s): name one as P/N",
			projector.Printable(flag), projector.Printable(name), strings.Join(have, " "))}
	}
	if err != nil {
		return postgres.Segment{}, usageError{fmt.Errorf("--partition %s: want P/N or P, whole numbers", projector.Printable(flag))}
	}
	seg, err := postgres.SegmentOf(p, n)
	if err != nil {
		return postgres.Segment{}, usageError{fmt.Errorf("--partition %s: %w", projector.Printable(flag), err)}
	}
	if !slices.Contains(have, seg.String()) {
		return postgres.Segment{}, usageError{fmt.Errorf("--partition %s: consumer %s has partitions %s", projector.Printable(flag), projector.Printable(name), strings.Join(have, " "))}
	}
	return seg, nil
}

// partitionsOf resolves NAME and --partition for split and merge: the
// partitions to act on, none for every one.
func partitionsOf(cmd *cobra.Command, admin *projection.Admin, name, flag string) ([]postgres.Segment, error) {
	if cmd.Flags().Changed("instance") {
		return nil, usageError{errors.New("--instance: split and merge act on partitions; name one with --partition")}
	}
	shards, err := admin.List(cmd.Context(), name)
	if err != nil {
		return nil, err
	}
	if len(shards) == 0 {
		return nil, unknownConsumer(cmd.Context(), admin, name, fmt.Errorf("consumer %s: %w", projector.Printable(name), projector.ErrNotFound))
	}
	var parts []projection.ShardState
	for _, s := range shards {
		if s.Partitions > 0 {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return nil, usageError{fmt.Errorf("consumer %s is not partitioned: declare AsyncConfig.Partitions to partition it", projector.Printable(name))}
	}
	if !cmd.Flags().Changed("partition") {
		return nil, nil
	}
	seg, err := partitionFlag(name, flag, parts)
	if err != nil {
		return nil, err
	}
	return []postgres.Segment{seg}, nil
}

func (a *App) splitCmd(partition *string) *cobra.Command {
	return &cobra.Command{
		Use:   "split NAME",
		Short: "Split a partition (--partition) or every partition in two, live: each half starts at its cursor",
		Long: `Split replaces a partition by its two halves (P/N by 2P/2N and 2P+1/2N), each
starting at the partition's cursor, with its dead letters, parks and a failure
being retried going to the half that holds their stream. Without --partition every
partition splits. When a live dispatcher runs every partition to split, the command
marks them and each partition's own pass splits it at the end of its batch, so
nothing waits for a running batch (each split is its own commit; the command
returns once all are done, and splits what is left itself after 5 s); otherwise it
splits them in one transaction, waiting for their running batches. Running
dispatchers start the halves at once, with no restart and no rebuild. Refused
(exit code 3) when another split or merge changed the partitions first.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withAdmin(cmd, func(admin *projection.Admin) error {
				only, err := partitionsOf(cmd, admin, args[0], *partition)
				if err != nil {
					return err
				}
				started := time.Now()
				changes, err := admin.Split(cmd.Context(), args[0], only...)
				if err != nil {
					return unknownConsumer(cmd.Context(), admin, args[0], err)
				}
				a.printChanges("split", args[0], changes, time.Since(started))
				return nil
			})
		},
	}
}

func (a *App) mergeCmd(partition *string) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "merge NAME",
		Short: "Merge a partition (--partition) with its sibling, or every sibling pair, live, once their cursors meet",
		Long: `Merge replaces two sibling partitions (2P/2N and 2P+1/2N) by their parent P/N.
The parent's cursor must mean both halves applied every event up to it, so merge
holds each pair at a position of its own (their common cursor; when both are
caught up, the horizon at the hold; else the cursor of the one ahead). A pair
whose halves stand there already is swapped at once; for the others it waits for
the running dispatchers to bring both there (--wait), and the pass of the half
there second, or the command, swaps the rows; dead letters and parks go to the
parent. Nothing is applied by the command. Without --partition every pair whose
halves both exist merges. On timeout the holds of the pairs not merged are lifted
(exit code 1; the error names the pairs merged by then); a failing, dead or
disabled half, or another operator's split or merge winning, is refused (exit
code 3).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wait < minMergeWait || wait > maxMergeWait {
				return usageError{fmt.Errorf("--wait %v: want %v to %v", wait, minMergeWait, maxMergeWait)}
			}
			return a.withAdmin(cmd, func(admin *projection.Admin) error {
				only, err := partitionsOf(cmd, admin, args[0], *partition)
				if err != nil {
					return err
				}
				started := time.Now()
				changes, err := admin.Merge(cmd.Context(), args[0], wait, only...)
				if err != nil {
					return unknownConsumer(cmd.Context(), admin, args[0], err)
				}
				a.printChanges("merge", args[0], changes, time.Since(started))
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", defaultMergeWait, fmt.Sprintf("how long to wait for the halves' cursors to meet (%v to %v)", minMergeWait, maxMergeWait))
	return cmd
}

func (a *App) printChanges(op, name string, changes []projection.PartitionChange, took time.Duration) {
	for _, c := range changes {
		fmt.Fprintf(a.out, "%s %s: %s at %s\n", op, projector.Printable(name), c, cursor(c.Cursor))
	}
	fmt.Fprintf(a.out, "%s %s: %d done in %v\n", op, projector.Printable(name), len(changes), took.Round(time.Millisecond))
}

// shardArgs is how the consumer commands take a shard: NAME for a shared
// one, NAME --partition P/N for a partition, NAME --instance ID otherwise;
// partition says it is a partition. Advice prints it after a command name.
func shardArgs(consumer, instance string) (args string, partition bool) {
	args = projector.Printable(consumer)
	switch {
	case strings.HasPrefix(instance, projection.PartitionPrefix):
		return args + " --partition " + projector.Printable(strings.TrimPrefix(instance, projection.PartitionPrefix)), true
	case instance != projection.SharedInstance:
		args += " --instance " + projector.Printable(instance)
	}
	return args, false
}
