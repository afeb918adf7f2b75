package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Forgets and partitions (promise 19 across promise 16).
//
// A partition applies a customer's events, and another partition, whose
// segment holds the subject's stream, applies the forgotten event. A pass
// reads an event with the subject's key still there and hands its
// handlers the personal fields in the clear; if the forget commits while
// that pass runs, the other partition can apply the forgotten event before
// the pass commits (the pass takes its transaction id only at its first
// write, possibly after the forget's), and its OnForgotten cannot see the
// rows the pass has not committed yet: the name would survive the forget.
// One shard applying both events in log order under one lock never races
// so, which is why only a partitioned consumer's passes guard.
//
// The guard, in the pass's transaction before it commits: the key rows of
// the subjects whose fields its handlers were given opened are locked FOR
// SHARE, and read. A forget that committed since the events were read is
// seen there, and the pass rolls back and reads again (the fields come
// back null and the event Forgotten); one that comes later waits for the
// pass (its Destroy updates a locked row), so the forgotten event commits
// after the pass's rows and its OnForgotten sees them, whichever partition
// applies it.

// forgetsGuarded reports whether what a consumer applies over store
// guards against forgets: the consumer is partitioned, its registry has
// personal fields, and their keys are in the store's key table (a key
// store of another kind cannot be locked from here).
func forgetsGuarded(store *postgres.Store, partitioned bool) bool {
	if !partitioned || !store.Registry().HasPersonal() {
		return false
	}
	_, ok := store.Keys().(*postgres.KeyTable)
	return ok
}

// guardsForgets reports whether sh's passes guard against forgets: a
// partition (not a rebuild's shadow) of a consumer forgetsGuarded.
func (d *Dispatcher) guardsForgets(sh *shard) bool {
	return sh.shadow == nil && forgetsGuarded(d.store, sh.proj.cfg.Partitions > 1)
}

// openedSubjectsForgotten is [openedForgotten] for a pass of sh: it does
// nothing (false) for a shard that does not guard (guardsForgets).
func (d *Dispatcher) openedSubjectsForgotten(ctx context.Context, tx pgx.Tx, sh *shard, events []projector.Event) (bool, error) {
	if !d.guardsForgets(sh) {
		return false, nil
	}
	return openedForgotten(ctx, tx, d.store, events)
}

// openedForgotten locks, in tx (unscoped), the key rows of the subjects
// whose personal fields events were handed opened, and reports whether
// any of them is forgotten now: what was applied must then be rolled
// back, as handlers may have copied fields a forget has since destroyed.
// Passes (openedSubjectsForgotten) and retries (applyGuarded) call it.
func openedForgotten(ctx context.Context, tx pgx.Tx, store *postgres.Store, events []projector.Event) (bool, error) {
	if len(events) == 0 {
		return false, nil
	}
	reg := store.Registry()
	type ref struct{ tenant, id string }
	seen := map[ref]bool{}
	var tenants, subjects []string
	for _, ev := range events {
		if ev.Forgotten {
			continue
		}
		p, ok := reg.PersonalOf(ev.Type)
		if !ok || !p.HoldsClearValue(ev.Data) {
			// Nothing opened: an event with no personal value reads the
			// same, and is not Forgotten, after its subject's forget, so
			// looking at its subject would roll the batch back for ever.
			continue
		}
		id, err := p.SubjectOf(ev.Data)
		if err != nil {
			continue // no subject: nothing of one was opened
		}
		if r := (ref{ev.Stream.Tenant, id}); !seen[r] {
			seen[r] = true
			tenants, subjects = append(tenants, r.tenant), append(subjects, r.id)
		}
	}
	if len(subjects) == 0 {
		return false, nil
	}
	var forgotten bool
	err := tx.QueryRow(ctx, `SELECT coalesce(bool_or(k.forgotten), false) FROM (
			SELECT k.wrapped IS NULL AS forgotten FROM `+store.Table("projector_subject_keys")+` k
			JOIN unnest($1::text[], $2::text[]) AS u(tenant_id, subject) USING (tenant_id, subject)
			ORDER BY k.tenant_id, k.subject FOR SHARE OF k) k`, tenants, subjects).Scan(&forgotten)
	if err != nil {
		return false, fmt.Errorf("lock the key rows of the subjects opened: %w", err)
	}
	return forgotten, nil
}

// applyGuarded is how a retry (of a park, of a dead letter) applies its
// events in tx, all or nothing: read reads them, apply hands them to the
// handlers, and a failure (herr) rolls back to a savepoint taken before,
// so nothing of the retry is applied and the caller records the failure.
//
// A retry applies outside the pass, and on a partition of a consumer
// forgetsGuarded (guard) it can race a forget as a pass can: the
// subject's stream, and so the forgotten event, may be another
// partition's. A retry whose transaction took its id before the forget's
// holds that partition's reads back (their horizon); one whose id is
// younger can read the events with the key there, the forget commit, and
// the forgotten event be applied before the retry commits. So, once
// apply succeeds, the key rows of the subjects whose fields it was handed
// opened are locked FOR SHARE (openedForgotten): one forgotten since read
// rolls the retry back to the savepoint, and the events are read (now
// Forgotten, their fields null) and applied again; a forget that comes
// later waits for the retry to commit, so the forgotten event is applied
// after the retry's rows and its OnForgotten sees them. A subject is
// forgotten once and stays so, so each round that rolls back leaves one
// subject fewer opened: the rounds are bounded by the events.
func applyGuarded(ctx context.Context, tx pgx.Tx, store *postgres.Store, guard bool, what string,
	read func() ([]projector.Event, error), apply func([]projector.Event) (herr, err error),
) (events []projector.Event, herr, err error) {
	if _, err := tx.Exec(ctx, `SAVEPOINT projector_retry`); err != nil {
		return nil, nil, fmt.Errorf("retry %s: %w", what, err)
	}
	for round := 0; ; round++ {
		if events, err = read(); err != nil {
			return nil, nil, err
		}
		if round > len(events) {
			return nil, nil, fmt.Errorf("retry %s: its events' subjects were forgotten in each of %d rounds of applying them; nothing applied, try again",
				what, round)
		}
		if herr, err = apply(events); err != nil {
			return nil, nil, err
		}
		if herr != nil {
			if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT projector_retry`); err != nil {
				return nil, nil, fmt.Errorf("retry %s: roll back the failed retry: %w", what, err)
			}
			return events, herr, nil
		}
		if !guard {
			return events, nil, nil
		}
		forgotten, err := openedForgotten(ctx, tx, store, events)
		if err != nil {
			return nil, nil, fmt.Errorf("retry %s: %w", what, err)
		}
		if !forgotten {
			return events, nil, nil
		}
		// A forget committed since read: apply the events as they read now.
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT projector_retry`); err != nil {
			return nil, nil, fmt.Errorf("retry %s: roll back to read its forgotten events again: %w", what, err)
		}
	}
}

// retryGuardsForgets reports whether a retry of p's events on shard id
// guards against forgets (applyGuarded): the shard is a partition. A
// consumer in one shard applies a subject's stream and its customers'
// in log order under one lock, and a retry holds that lock: no race.
func retryGuardsForgets(store *postgres.Store, p *Async, id ShardID) bool {
	_, _, partition := ParsePartition(id.Instance)
	return forgetsGuarded(store, partition || p.cfg.Partitions > 1)
}
