package helpdesk

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// WorkloadVersion is the version of agent_workload the example application
// runs. Version 2 ([NewWorkload]) fixes how reassigned tickets are counted;
// the demo rolls it out with a blue/green rebuild.
const WorkloadVersion = 1

// NewWorkload builds the agent_workload projection (async, per-event
// handlers) over the helpdesk tables in schema: open and closed tickets per
// agent, and the ticket → agent map it keeps to know whose ticket closed.
//
// Version 1 counts a ticket as open for every agent it was ever assigned
// to: a reassigned ticket stays open on its first agent's count for good.
// Version 2 moves it: the previous agent's open count goes down as the new
// one's goes up. A new version changes what the tables hold, so it is rolled
// out by rebuilding (`projector rebuild agent_workload`): its dispatchers
// build it into shadow copies of the declared tables while version 1 keeps
// serving, then switch.
//
// The handlers qualify table names with the schema, so they ask
// projection.Table for each: during a blue/green rebuild it names the
// shadow table.
func NewWorkload(types Types, schema string, version int) (*projection.Async, error) {
	if version != 1 && version != 2 {
		return nil, fmt.Errorf("agent_workload: version %d: the helpdesk has versions 1 and 2", version)
	}
	workload, assign := schema+"."+WorkloadTable, schema+"."+AssignTable
	p := projection.NewAsync("agent_workload", projection.AsyncConfig{
		Version: version,
		Tables:  []string{workload, assign},
	})
	err := errors.Join(
		projection.On(p, types.TicketAssigned, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e TicketAssigned) error {
			// The workload keeps its own ticket → agent map rather than
			// reading the inline summary, which may be ahead of this event.
			var previous string
			if version >= 2 {
				err := tx.QueryRow(ctx, `SELECT agent FROM `+projection.Table(ctx, assign)+` WHERE ticket_id = $1`, ev.Stream.ID).Scan(&previous)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) {
					return err
				}
			}
			if previous == e.Agent {
				return nil
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, assign)+` (ticket_id, agent) VALUES ($1, $2)
				ON CONFLICT (ticket_id) DO UPDATE SET agent = excluded.agent`, ev.Stream.ID, e.Agent); err != nil {
				return err
			}
			if previous != "" {
				if _, err := tx.Exec(ctx, `UPDATE `+projection.Table(ctx, workload)+` SET open = open - 1 WHERE agent = $1`, previous); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, workload)+` AS w (agent, open) VALUES ($1, 1)
				ON CONFLICT (agent) DO UPDATE SET open = w.open + 1`, e.Agent)
			return err
		}),
		projection.On(p, types.TicketClosed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ TicketClosed) error {
			_, err := tx.Exec(ctx, `UPDATE `+projection.Table(ctx, workload)+` w SET open = w.open - 1, closed = w.closed + 1
				FROM `+projection.Table(ctx, assign)+` a WHERE a.ticket_id = $1 AND w.agent = a.agent`, ev.Stream.ID)
			return err
		}),
	)
	if err != nil {
		return nil, err
	}
	return p, nil
}
