package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// sealed reports whether the saga's state declares personal fields
// (Config.Personal).
func (s *Saga[S]) sealed() bool { return s.cfg.Personal.Subject != "" }

// checkMasterKey refuses a state with personal fields on a store that
// could not seal it (postgres.Store.CheckMasterKey): at start, where the
// saga's consumer or runner is built.
func (s *Saga[S]) checkMasterKey(store *postgres.Store) error {
	if !s.sealed() {
		return nil
	}
	return store.CheckMasterKey(fmt.Sprintf("saga %q: Config.Personal", s.name))
}

// zeroPersonal returns the encoding of each declared personal field in the
// zero state: what such a field holds when it holds nothing personal.
func zeroPersonal[S any](p projector.Personal) map[string]json.RawMessage {
	var zero S
	data, err := json.Marshal(zero)
	if err != nil {
		return nil // the state does not encode: every step fails on it
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return nil
	}
	out := make(map[string]json.RawMessage, len(p.Fields))
	for _, f := range p.Fields {
		out[f] = fields[f]
	}
	return out
}

// sealable reports whether an encoded state names its subject, so its
// personal fields can be sealed under the subject's key. A state without a
// subject may hold no personal data (each personal field null or its zero
// value): else it is an error, since nothing could seal it.
func (s *Saga[S]) sealable(data []byte) (bool, error) {
	_, subjectErr := s.cfg.Personal.SubjectOf(data)
	if subjectErr == nil {
		return true, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return false, fmt.Errorf("state: %w", err)
	}
	for _, f := range s.cfg.Personal.Fields {
		v, ok := fields[f]
		if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) || bytes.Equal(v, s.zeroPersonal[f]) {
			continue
		}
		return false, fmt.Errorf("personal field %q of the state is set, but %w", f, subjectErr)
	}
	return false, nil
}

// encodeState encodes an instance's state for its row in tx: the declared
// personal fields sealed under the subject's key in tenant (creating the
// key with tx, as an append does; written as null once the subject is
// forgotten).
func (s *Saga[S]) encodeState(ctx context.Context, store *postgres.Store, tx pgx.Tx, tenant string, state S) ([]byte, error) {
	data, err := json.Marshal(state)
	if err != nil || !s.sealed() {
		return data, err
	}
	ok, err := s.sealable(data)
	if err != nil || !ok {
		return data, err
	}
	return store.SealTx(ctx, tx, tenant, s.cfg.Personal, data)
}

// decodeState decodes a state read from an instance row of tenant,
// opening its sealed personal fields with keys read through db: a
// forgotten subject's fields decode as zero values.
func (s *Saga[S]) decodeState(ctx context.Context, store *postgres.Store, db postgres.DBTX, tenant string, data []byte) (S, error) {
	var state S
	if s.sealed() {
		opened, _, err := store.OpenData(ctx, db, tenant, s.cfg.Personal, data)
		if err != nil {
			return state, err
		}
		data = opened
	}
	err := json.Unmarshal(data, &state)
	return state, err
}

// redacted returns a step's failure with the personal values it may quote
// replaced in its text (projection.StoredError): those of the events the
// step handled, and those of the state it was given (Config.Personal), in
// the clear to the handler. Its text is stored as a dead letter's, a park's,
// the instance's or a timeout's error, which a forget does not reach.
func (s *Saga[S]) redacted(store *postgres.Store, cause error, state S, events ...projector.Event) error {
	if cause == nil {
		return nil // (a timeout's deferred call on success: no state to marshal)
	}
	opened := projection.OpenedEvents(store.Registry(), events...)
	if len(s.cfg.Personal.Fields) > 0 {
		if data, err := json.Marshal(state); err == nil {
			opened = append(opened, projection.Opened{Personal: s.cfg.Personal, Data: data})
		}
	}
	return projection.RedactError(cause, opened...)
}
