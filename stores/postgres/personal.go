package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// setupKeys picks the store's key store: the configured one, or the key
// table of the store's schema wrapped by Config.MasterKey or, without one,
// the master key in PROJECTOR_MASTER_KEY. A malformed variable is an error
// here; a missing one only once personal data is sealed or opened.
func (s *Store) setupKeys(cfg Config) error {
	if cfg.Keys != nil {
		s.keys = cfg.Keys
		return nil
	}
	master := cfg.MasterKey
	if master == nil {
		if v := os.Getenv(MasterKeyEnv); v != "" {
			var err error
			if master, err = ParseMasterKey(v); err != nil {
				return fmt.Errorf("postgres store: %s: %w", MasterKeyEnv, err)
			}
		}
	}
	kt, err := NewKeyTable(s.schema, master)
	if err != nil {
		return err
	}
	s.keys = kt
	return nil
}

// Keys returns the store's key store.
func (s *Store) Keys() KeyStore { return s.keys }

// seal encrypts the personal fields of an encoded payload under its
// subject's key, creating the key in tx if needed; keys caches the keys
// this append already fetched. The payload is left as it is when its type
// declares no personal fields.
func (s *Store) seal(ctx context.Context, tx pgx.Tx, tenant string, enc projector.Encoded, keys map[SubjectRef][]byte) (json.RawMessage, error) {
	p, ok := s.registry.PersonalOf(enc.Type)
	if !ok {
		return enc.Data, nil
	}
	id, err := p.SubjectOf(enc.Data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", enc.Type, err)
	}
	ref := SubjectRef{Tenant: tenant, ID: id}
	key, ok := keys[ref]
	if !ok {
		if key, err = s.keys.DataKey(ctx, tx, ref); err != nil {
			return nil, err
		}
		keys[ref] = key
	}
	return p.Seal(enc.Data, id, key)
}

// open opens the sealed personal fields of events in place, reading their
// subjects' keys through db in one statement. A forgotten subject's fields
// become null and the event is marked Forgotten. Events of types without
// personal fields, and those with nothing sealed, are left alone.
func (s *Store) open(ctx context.Context, db DBTX, events []projector.Event) error {
	type sealed struct {
		i   int
		ref SubjectRef
	}
	var todo []sealed
	var refs []SubjectRef
	seen := map[SubjectRef]bool{}
	for i := range events {
		ev := &events[i]
		p, ok := s.registry.PersonalOf(ev.Type)
		if !ok || !projector.IsSealed(ev.Data) {
			continue
		}
		id, err := p.SubjectOf(ev.Data)
		if err != nil {
			return fmt.Errorf("event %s (%s): %w", ev.ID, ev.Type, err)
		}
		ref := SubjectRef{Tenant: ev.Stream.Tenant, ID: id}
		todo = append(todo, sealed{i, ref})
		if !seen[ref] {
			seen[ref] = true
			refs = append(refs, ref)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	keys, err := s.keys.DataKeys(ctx, db, refs)
	if err != nil {
		return err
	}
	for _, t := range todo {
		ev := &events[t.i]
		data, forgotten, err := projector.Open(ev.Data, t.ref.ID, keys[t.ref])
		if err != nil {
			return fmt.Errorf("event %s (%s of %s): %w", ev.ID, ev.Type, ev.Stream, err)
		}
		ev.Data, ev.Forgotten = data, forgotten
	}
	return nil
}

// OpenEvents opens the sealed personal fields of events read from the
// events table by a package's own query (the store's reads do it
// themselves), reading keys through db. A forgotten subject's fields
// become null and the event is marked Forgotten; see docs/privacy.md.
func (s *Store) OpenEvents(ctx context.Context, db DBTX, events []projector.Event) error {
	return s.open(ctx, db, events)
}

// ForgetResult is what [Store.Forget] did.
type ForgetResult struct {
	// Subject is the forgotten subject.
	Subject SubjectRef
	// At is when the key was destroyed (the transaction's time).
	At time.Time
	// Event is the subject.forgotten event appended in the same
	// transaction.
	Event projector.Event
}

// Forget forgets a data subject in its own transaction: see
// [Store.ForgetTx].
func (s *Store) Forget(ctx context.Context, subject SubjectRef) (ForgetResult, error) {
	var res ForgetResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		res, err = s.ForgetTx(ctx, tx, subject)
		return err
	})
	return res, err
}

// ForgetTx destroys the data subject's key and appends a
// [projector.SubjectForgotten] event to the subject's stream (tenant
// subject.Tenant, type [projector.SubjectStreamType], id subject.ID), both
// inside tx: they commit together or not at all. From the commit on, every
// read of the subject's events finds its personal fields null and the
// event marked Forgotten, and projections handling the forgotten event
// delete or blank what they hold (promise 19; docs/privacy.md).
//
// A subject without a key fails matching [projector.ErrNotFound], one
// already forgotten matching [projector.ErrInvalidTransition]; nothing is
// written either way. Of two forgets racing for one subject, one wins.
// No master key is needed to forget.
func (s *Store) ForgetTx(ctx context.Context, tx pgx.Tx, subject SubjectRef) (ForgetResult, error) {
	if err := subject.Validate(); err != nil {
		return ForgetResult{}, fmt.Errorf("forget: %w", err)
	}
	stream := projector.TenantStream(subject.Tenant, projector.SubjectStreamType, subject.ID)
	if err := stream.Validate(); err != nil {
		return ForgetResult{}, fmt.Errorf("forget: %w", err)
	}
	if !s.registry.HasPersonal() {
		return ForgetResult{}, fmt.Errorf("forget subject %s: %w: the registry defines no event type with personal fields", subject, projector.ErrUnknownEventType)
	}
	at, err := s.keys.Destroy(ctx, tx, subject)
	if err != nil {
		return ForgetResult{}, fmt.Errorf("forget: %w", err)
	}
	res, err := s.Append(ctx, tx, stream, projector.AnyVersion, projector.SubjectForgotten{Subject: subject.ID})
	if err != nil {
		return ForgetResult{}, fmt.Errorf("forget subject %s: %w", subject, err)
	}
	return ForgetResult{Subject: subject, At: at, Event: res.Events[0]}, nil
}
