package projection

import (
	"bytes"
	"context"
	"encoding/json"
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

// guardsForgets reports whether sh's passes guard against forgets: a
// partition of a consumer over a registry with personal fields, whose keys
// are in the store's key table (a key store of another kind cannot be
// locked from here).
func (d *Dispatcher) guardsForgets(sh *shard) bool {
	if sh.proj.cfg.Partitions <= 1 || sh.shadow != nil || !d.store.Registry().HasPersonal() {
		return false
	}
	_, ok := d.store.Keys().(*postgres.KeyTable)
	return ok
}

// openedSubjectsForgotten locks, in tx (unscoped), the key rows of the
// subjects whose personal fields events were handed opened, and reports
// whether any of them is forgotten now: the pass must then roll back, as
// its handlers may have copied fields a forget has since destroyed. It
// does nothing (false) for a shard that does not guard (guardsForgets).
func (d *Dispatcher) openedSubjectsForgotten(ctx context.Context, tx pgx.Tx, sh *shard, events []projector.Event) (bool, error) {
	if len(events) == 0 || !d.guardsForgets(sh) {
		return false, nil
	}
	reg := d.store.Registry()
	type ref struct{ tenant, id string }
	seen := map[ref]bool{}
	var tenants, subjects []string
	for _, ev := range events {
		if ev.Forgotten {
			continue
		}
		p, ok := reg.PersonalOf(ev.Type)
		if !ok || !holdsPersonalValue(p, ev.Data) {
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
			SELECT k.wrapped IS NULL AS forgotten FROM `+d.store.Table("projector_subject_keys")+` k
			JOIN unnest($1::text[], $2::text[]) AS u(tenant_id, subject) USING (tenant_id, subject)
			ORDER BY k.tenant_id, k.subject FOR SHARE OF k) k`, tenants, subjects).Scan(&forgotten)
	if err != nil {
		return false, fmt.Errorf("lock the key rows of the subjects opened: %w", err)
	}
	return forgotten, nil
}

// holdsPersonalValue reports whether data, an opened payload (a JSON
// object), holds a value other than null in one of p's personal fields:
// one a handler was given in the clear.
func holdsPersonalValue(p projector.Personal, data json.RawMessage) bool {
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil {
		return true // not an object: look at its subject all the same
	}
	for _, f := range p.Fields {
		if v, ok := members[f]; ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return true
		}
	}
	return false
}
