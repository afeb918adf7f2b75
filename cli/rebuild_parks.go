package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// finishRebuild says how rebuild r ended (endOfRebuild) and, when it
// switched or is done, which of its consumer's streams are parked
// (ParkStream): `rebuild --wait` and `--here` used to say "switched" and
// exit 0 while the new version had parked streams it could not apply, and
// the operator learnt it from `status` later, if at all. The exit code
// stays 0: the rebuild did what was asked (the switch cannot be undone,
// and a script that took exit 1 for a failed rebuild would request another
// replay that parks the same streams); the parks are the error mode the
// consumer chose, held for a retry or a discard (docs/rebuilds.md).
func (a *App) finishRebuild(cmd *cobra.Command, store *postgres.Store, r rebuild.Rebuild) error {
	if err := endOfRebuild(a.out, r); err != nil {
		return err
	}
	return a.reportParks(cmd, store, r)
}

// reportParks prints, for rebuild r, the open parks of its consumer: a
// rebuild held at ready, those of its shadow shard, which the switch hands
// to the live shards; a rebuild switched or done, those of the live
// shards the rebuild itself parked, and (in place) those it kept from
// before it. Nothing when there are none.
//
// Which parks the rebuild made is read from the rows, exactly, without a
// record of the rebuild on them: blue/green, the switch resolves every
// open park of the live shards in its transaction and hands over the
// shadow's, keeping their parked_at, so an open park parked by the end of
// the switch (finished_at, the switch's now()) was the shadow's, and one
// parked later is live; in place, the request rewinds the live shards, so
// a park made since the request of an event at or before the rebuild's
// target (the log's end when it started) is the replay's, and one of a
// later event, or made after the end, is live. It counted every park
// since the request, a live one made after the end (or, in place, of an
// event past the target) included.
func (a *App) reportParks(cmd *cobra.Command, store *postgres.Store, r rebuild.Rebuild) error {
	var during, before int
	var end *time.Time
	if !r.FinishedAt.IsZero() {
		end = &r.FinishedAt
	}
	err := store.Pool().QueryRow(cmd.Context(), `SELECT
			count(*) FILTER (WHERE p.parked_at >= $3 AND ($5::timestamptz IS NULL OR p.parked_at <= $5)
				AND (NOT $6::bool OR (e.tx_id, e.seq) <= ($7::xid8, $8::bigint))),
			count(*) FILTER (WHERE p.parked_at < $3)
		FROM `+store.Table("projector_parks")+` p LEFT JOIN `+store.Table("projector_events")+` e ON e.id = p.event_id
		WHERE p.consumer = $1 AND p.status = 'parked' AND (p.instance_id = $2) = $4`,
		r.Name, projection.RebuildInstance, r.RequestedAt, r.Status == rebuild.Ready, end,
		r.Mode == rebuild.InPlace, r.Target.TxID, r.Target.Seq).Scan(&during, &before)
	if err != nil {
		return fmt.Errorf("rebuild %d of %s %s; counting its consumer's parked streams: %w", r.ID, r.Name, r.Status, err)
	}
	root, name := cmd.Root().Name(), projector.Printable(r.Name)
	if r.Status == rebuild.Ready {
		if during > 0 {
			fmt.Fprintf(a.out, "%s parked by the new version so far: the switch hands them to the live consumer, held for a retry; see `%s parked list --consumer %s --instance %s`\n",
				streams(during), root, name, projection.RebuildInstance)
		}
		return nil
	}
	if during > 0 {
		fmt.Fprintf(a.out, "%s parked by the rebuild: see `%s parked list --consumer %s`; the rest of the model is live, these streams wait for `%s parked retry` (or discard) once their handler is fixed\n",
			streams(during), root, name, root)
	}
	if before > 0 {
		fmt.Fprintf(a.out, "%s parked before the rebuild still parked (an in-place rebuild keeps its parks): see `%s parked list --consumer %s`\n",
			streams(before), root, name)
	}
	return nil
}

// streams is "1 stream" or "N streams".
func streams(n int) string {
	if n == 1 {
		return "1 stream"
	}
	return fmt.Sprintf("%d streams", n)
}
