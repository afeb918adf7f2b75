package helpdesk

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// demoClock is the SLA saga's clock in the demo: it stands still until the
// demo moves it, so four hours of SLA pass in a moment.
type demoClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *demoClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *demoClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// slaDemo runs the SLA saga over the demo's tickets with a compressed
// clock: the saga's consumer catches up on the log (starting an instance
// per ticket, ending those assigned or closed), then the clock jumps to the
// reminder and to the deadline, and the runner fires what fell due.
func slaDemo(ctx context.Context, store *postgres.Store, types Types, tickets *aggregate.Repository[Ticket], out io.Writer) error {
	if _, err := DefineSLA(types.Registry); err != nil {
		return err
	}
	clock := &demoClock{t: time.Now()}
	sla, err := NewSLA(types, tickets, clock.Now)
	if err != nil {
		return err
	}
	consumer, err := sla.Projection(store)
	if err != nil {
		return err
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{consumer}, InstanceID: "demo", Logger: quietLogger(out)})
	if err != nil {
		return err
	}
	runner, err := saga.NewRunner(saga.RunnerConfig{Store: store, Sagas: []saga.Definition{sla}, Logger: quietLogger(out)})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = d.Stop(context.WithoutCancel(ctx)) }()
	if err := d.CatchUp(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== SLA (saga %s: high-priority tickets must be assigned within %v; the clock is compressed)\n", SLAName, SLAResponse)
	active, err := saga.List(ctx, store, saga.ListQuery{Saga: SLAName, Statuses: []saga.Status{saga.Active}, Limit: 10_000})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d high-priority tickets still unassigned, each with a reminder and an escalation pending\n", len(active))
	for _, step := range []struct {
		by   time.Duration
		what string
	}{{SLAResponse / 2, "reminders"}, {SLAResponse / 2, "escalations"}} {
		clock.advance(step.by)
		n, err := runner.FireDue(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "+%v: %d timeouts fired (%s)\n", step.by, n, step.what)
	}
	if err := d.CatchUp(ctx); err != nil {
		return err
	}
	var escalated, reminders int
	err = store.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE type = 'ticket.escalated'),
			count(*) FILTER (WHERE type = 'ticket.commented' AND data->>'author' = 'sla')
		FROM `+store.Table("projector_events")+` WHERE stream_type = $1`, TicketStream).Scan(&escalated, &reminders)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d reminders commented and %d tickets escalated on their ticket streams, through the ticket aggregate\n", reminders, escalated)
	if len(active) > 0 {
		in, err := saga.Show(ctx, store, SLAName, projector.SystemTenant, active[0].Key)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "`projector saga show %s %s`: %s after %d steps, state %s\n", SLAName, in.Key, in.Status, in.Version, in.State)
		for _, s := range in.Steps {
			fmt.Fprintf(out, "  step %d: %s %s\n", s.Step, s.Cause, s.Type)
		}
		for _, a := range in.Appended {
			fmt.Fprintf(out, "  appended %s to %s v%d\n", a.Type, a.Stream, a.Version)
		}
	}
	return nil
}
