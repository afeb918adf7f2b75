package saga

// Parking of saga instances (ParkStream): a step that failed MaxAttempts
// times parks its instance, keyed by its correlation key, and the
// instance's later events wait in the park behind it, in log order, while
// other instances go on. The park is a row of the dispatcher's park table
// (projection/park_instance.go), so `projector parked` and the console
// cover it; a retry of it gives the parked sequence to the saga's handler
// again, which then takes the steps instead of holding them.

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// batchParks is what a batch knows of its instances' parks: the open ones
// by key, and the events it holds in them, to be written at the end.
type batchParks[S any] struct {
	ids   map[string]int64
	held  map[int64][]projector.Event
	order []int64
	// retry is the park a retry is applying, if this batch is one.
	retry   projection.Park
	retries bool
}

// parksOf reads the open parks of the batch's parked instances (none is
// read when none is parked: the common case costs nothing).
func (s *Saga[S]) parksOf(ctx context.Context, store *postgres.Store, tx pgx.Tx, tenant string, instances map[string]*live[S]) (*batchParks[S], error) {
	p := &batchParks[S]{ids: map[string]int64{}, held: map[int64][]projector.Event{}}
	p.retry, p.retries = projection.RetryingPark(ctx)
	var keys []string
	for key, in := range instances {
		if in.snap.Status == Parked {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return p, nil
	}
	err := s.unscoped(ctx, store, tx, tenant, func() error {
		var err error
		p.ids, err = projection.OpenInstanceParks(ctx, tx, store, s.name, tenant, keys)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("saga %q: %w", s.name, err)
	}
	return p, nil
}

// retrying reports whether the batch is a retry of in's park.
func (p *batchParks[S]) retrying(saga, tenant string, in *live[S]) bool {
	return p.retries && p.retry.Kind == projection.ParkKindSagaInstance && p.retry.Consumer == saga &&
		p.retry.Tenant == tenant && p.retry.StreamID == in.snap.Key
}

// hold takes ev of parked instance in: into its park, reporting true; or,
// when the batch is a retry of that park, or the park is gone (discarded
// while the instance was read), makes the instance active again and
// reports false, for ev to take its step.
func (p *batchParks[S]) hold(saga, tenant string, in *live[S], ev projector.Event) bool {
	id := p.ids[in.snap.Key]
	if id == 0 || p.retrying(saga, tenant, in) {
		in.snap.Status = Active
		return false
	}
	p.add(id, ev)
	return true
}

func (p *batchParks[S]) add(id int64, ev projector.Event) {
	if _, ok := p.held[id]; !ok {
		p.order = append(p.order, id)
	}
	p.held[id] = append(p.held[id], ev)
}

// write adds the held events to their parks, in log order.
func (p *batchParks[S]) write(ctx context.Context, s *Saga[S], store *postgres.Store, tx pgx.Tx, tenant string) error {
	if len(p.order) == 0 {
		return nil
	}
	return s.unscoped(ctx, store, tx, tenant, func() error {
		for _, id := range p.order {
			if err := projection.HoldInstanceEvents(ctx, tx, store, id, p.held[id]); err != nil {
				return fmt.Errorf("saga %q: %w", s.name, err)
			}
		}
		return nil
	})
}

// parkStep is ParkStream's answer to an event's failing step (nothing of
// it written): before MaxAttempts the batch fails, for the dispatcher to
// retry it with backoff; at MaxAttempts the instance is parked with ev at
// the head of its park, keeping its state and its timeouts.
func (s *Saga[S]) parkStep(ctx context.Context, store *postgres.Store, tx pgx.Tx, tenant string, parks *batchParks[S], in *live[S],
	ev projector.Event, cause error,
) error {
	cause = fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, cause)
	var id int64
	err := s.unscoped(ctx, store, tx, tenant, func() error {
		// The attempts are counted on the shard that handles ev: the
		// partition, when the saga is partitioned.
		shard := projection.ShardID{Consumer: s.name, Instance: projection.SharedInstance}
		if id, ok := projection.ShardFrom(ctx); ok {
			shard = id
		}
		attempts, err := projection.FailedAttempts(ctx, tx, store, shard, ev)
		if err != nil || attempts < s.cfg.Async.MaxAttempts {
			return err
		}
		id, err = projection.ParkInstance(ctx, tx, store, s.name, tenant, in.snap.Key, ev, cause, attempts)
		return err
	})
	if err != nil {
		return fmt.Errorf("saga %q: %w", s.name, err)
	}
	if id == 0 {
		return cause
	}
	in.snap.Status = Parked
	parks.ids[in.snap.Key] = id
	parks.add(id, ev)
	s.parked.Add(1)
	return nil
}

// unscoped runs fn with tx unscoped (the dispatcher's tables, which a
// tenant role has no rights on), and scopes tx back to tenant after.
func (s *Saga[S]) unscoped(ctx context.Context, store *postgres.Store, tx pgx.Tx, tenant string, fn func() error) error {
	scope := tenant
	if err := scopeTo(ctx, store, tx, &scope, projector.SystemTenant); err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	return scopeTo(ctx, store, tx, &scope, tenant)
}

// Reactivate makes the failed instance key of saga in tenant active again
// (`projector saga retry` of a failed instance), recording nothing else:
// its timeouts were cancelled when it failed and the events that reached it
// since were counted as late, not kept. The event whose step failed it in
// continuous mode is in the dead letters: retry it there to take its step.
// Only a failed instance can be reactivated, in one guarded statement, so
// of operators racing exactly one succeeds; the others, and an instance in
// another status, get [projector.ErrInvalidTransition]. A parked instance
// is retried through its park ([InstancePark], projection.RetryPark).
func Reactivate(ctx context.Context, store *postgres.Store, saga, tenant, key string) (InstanceInfo, error) {
	if err := checkText("reactivate saga instance", "saga", saga, "tenant", tenant, "key", key); err != nil {
		return InstanceInfo{}, err
	}
	tag, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_saga_instances")+`
		SET status = 'active', last_error = NULL, updated_at = now()
		WHERE saga = $1 AND tenant_id = $2 AND key = $3 AND status = 'failed'`, saga, tenant, key)
	if err != nil {
		return InstanceInfo{}, fmt.Errorf("reactivate saga instance %s of %s: %w", projector.Printable(key), projector.Printable(saga), err)
	}
	in, serr := Show(ctx, store, saga, tenant, key)
	if serr != nil {
		return InstanceInfo{}, serr
	}
	if tag.RowsAffected() != 1 {
		return in.InstanceInfo, fmt.Errorf("reactivate saga instance %s of %s: it is %s, not failed: %w", projector.Printable(key),
			projector.Printable(saga), in.Status, projector.ErrInvalidTransition)
	}
	return in.InstanceInfo, nil
}

// InstancePark returns the id of the open park of the instance key of saga
// in tenant; [projector.ErrNotFound] when it has none.
func InstancePark(ctx context.Context, store *postgres.Store, saga, tenant, key string) (int64, error) {
	if err := checkText("saga instance park", "saga", saga, "tenant", tenant, "key", key); err != nil {
		return 0, err
	}
	var id int64
	err := store.Pool().QueryRow(ctx, `SELECT id FROM `+store.Table("projector_parks")+`
		WHERE consumer = $1 AND tenant_id = $2 AND stream_type = '' AND stream_id = $3
		  AND status = 'parked' AND kind = 'saga-instance'`, saga, tenant, key).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("saga instance %s of %s has no open park: %w", projector.Printable(key), projector.Printable(saga), projector.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("saga instance %s of %s: read its park: %w", projector.Printable(key), projector.Printable(saga), err)
	}
	return id, nil
}
