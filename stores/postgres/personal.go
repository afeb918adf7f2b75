package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	old := cfg.OldMasterKeys
	if old == nil {
		if v := os.Getenv(OldMasterKeysEnv); v != "" {
			var err error
			if old, err = ParseMasterKeys(v); err != nil {
				return fmt.Errorf("postgres store: %s: %w", OldMasterKeysEnv, err)
			}
		}
	}
	s.noMasterKey = master == nil && !cfg.AllowNoMasterKey
	if master == nil && s.registry.HasPersonal() && !cfg.AllowNoMasterKey {
		types, _ := s.registry.PersonalSubjects()
		return fmt.Errorf("postgres store: %w: event types %s declare personal fields, and without a master key every append "+
			"and read of them would fail; set %s (or Config.MasterKey), or Config.AllowNoMasterKey in a process that neither "+
			"appends nor reads them", ErrNoMasterKey, strings.Join(types, ", "), MasterKeyEnv)
	}
	kt, err := NewKeyTable(s.schema, master, old...)
	if err != nil {
		return fmt.Errorf("postgres store: %w", err)
	}
	if cfg.KeyCacheSize != 0 {
		kt.cache = newKeyCache(cfg.KeyCacheSize)
	}
	s.keys = kt
	return nil
}

// CheckMasterKey refuses personal data declared outside the registry —
// what names it, such as an aggregate's snapshots or a saga's state — on
// a store that could not seal or open it: its key store is the key table,
// with no master key, and Config.AllowNoMasterKey was not set. The error
// matches [ErrNoMasterKey], as New's for a registry with personal fields:
// a misconfigured process fails where the declaration is built, at start,
// not at its first write.
func (s *Store) CheckMasterKey(what string) error {
	if !s.noMasterKey {
		return nil
	}
	if _, ok := s.keys.(*KeyTable); !ok {
		return nil
	}
	return fmt.Errorf("%s: %w: it declares personal fields, and without a master key every write and read of them would fail; "+
		"set %s (or Config.MasterKey), or Config.AllowNoMasterKey in a process that neither writes nor reads them", what, ErrNoMasterKey, MasterKeyEnv)
}

// Keys returns the store's key store.
func (s *Store) Keys() KeyStore { return s.keys }

// sealing is what one append knows of its subjects' keys: those it
// fetched or took from the cache, and the guard for the cached ones.
type sealing struct {
	keys  map[SubjectRef]*projector.KeyCipher // nil: forgotten
	cache *keyCache                           // nil: fetch every key in the transaction
	// guardSubjects and guardWrapped are the subjects whose keys came from
	// the cache, and the wrapped key each was cached from: the insert
	// writes nothing unless every one still holds it (appendGuardSQL).
	guardSubjects []string
	guardWrapped  [][]byte
}

func (s *Store) newSealing(cached bool) *sealing {
	st := &sealing{keys: map[SubjectRef]*projector.KeyCipher{}}
	if kt, ok := s.keys.(*KeyTable); ok && cached {
		st.cache = kt.cache
	}
	return st
}

// errStaleKey: the append's key guard failed and nothing was written; the
// append runs again without the cache.
var errStaleKey = errors.New("a cached data key is no longer the subject's")

// checkGuard tells why a guarded append inserted nothing: errStaleKey,
// after dropping the append's cached keys, when the guard fails now (a
// forget is final, and a key that was not committed stays so in this
// transaction); nil when the guard holds and the head refused the append.
func (s *Store) checkGuard(ctx context.Context, tx pgx.Tx, tenant string, st *sealing) error {
	var ok bool
	if err := tx.QueryRow(ctx, s.sql.appendGuard, tenant, st.guardSubjects, st.guardWrapped).Scan(&ok); err != nil {
		return fmt.Errorf("check the data keys: %w", err)
	}
	if ok {
		return nil
	}
	for _, id := range st.guardSubjects {
		st.cache.drop(SubjectRef{Tenant: tenant, ID: id})
	}
	return errStaleKey
}

// seal encrypts the personal fields of an encoded payload under its
// subject's key: one this append already has, one from the process's
// cache (guarded, see sealing), or one read or created in tx. The payload
// is left as it is when its type declares no personal fields. forgotten
// reports that the subject was forgotten and a personal field held a value:
// that field is written as the envelope no key opens, which every read
// returns as null with the event marked Forgotten
// (projector.Personal.SealPayload). An event of a forgotten subject with
// no value in any personal field is not forgotten, on append as on reads.
//
// With apart, an event envelope of a type declared EnvelopeApart is
// returned beside the payload, for the events table's envelope column
// (an append); without, it stays in the payload (an import, whose COPY
// writes the payload alone).
func (s *Store) seal(ctx context.Context, tx pgx.Tx, tenant string, enc projector.Encoded, st *sealing, apart bool) (_ json.RawMessage, envelope []byte, forgotten bool, _ error) {
	p, ok := s.registry.PersonalOf(enc.Type)
	if !ok {
		return enc.Data, nil, false, nil
	}
	id, err := sealSubject(p, enc.Data)
	if err != nil {
		return nil, nil, false, fmt.Errorf("%s: %w", enc.Type, err)
	}
	ref := SubjectRef{Tenant: tenant, ID: id}
	c, ok := st.keys[ref]
	if !ok {
		if e, hit := st.cache.get(ref); hit {
			c = e.cipher
			st.guardSubjects = append(st.guardSubjects, id)
			st.guardWrapped = append(st.guardWrapped, e.wrapped)
		} else if c, err = s.dataKeyCipher(ctx, tx, ref); err != nil {
			return nil, nil, false, err
		}
		st.keys[ref] = c
	}
	if apart {
		return p.SealPayloadApart(enc.Data, id, c)
	}
	out, forgotten, err := p.SealPayload(enc.Data, id, c)
	return out, nil, forgotten, err
}

// sealSubject is the subject whose key seals data's personal fields: p's
// subject field, refused (matching [projector.ErrInvalidPayload]) when
// [Store.Forget] could not forget it. projector.Personal.SubjectOf refuses
// an empty id, a NUL or invalid UTF-8 but not a long one, and a forget
// appends to the subject's stream, whose id is the subject's id and holds
// at most [projector.MaxNameLength] bytes: sealed under a longer id, the
// data would be kept for good. Reads do not check the length, so what was
// stored before this check still opens.
func sealSubject(p projector.Personal, data json.RawMessage) (string, error) {
	id, err := p.SubjectOf(data)
	if err != nil {
		return "", err
	}
	if len(id) > projector.MaxNameLength {
		return "", fmt.Errorf("%w: the subject field %q is %d bytes long, over the limit of %d: the id names the subject's stream, "+
			"which forgetting it appends to", projector.ErrInvalidPayload, p.Subject, len(id), projector.MaxNameLength)
	}
	return id, nil
}

// dataKeyCipher reads or creates ref's key in tx: the key table's cached
// cipher, or one made from the key store's key; nil when forgotten.
func (s *Store) dataKeyCipher(ctx context.Context, tx pgx.Tx, ref SubjectRef) (*projector.KeyCipher, error) {
	key, err := s.keys.DataKey(ctx, tx, ref)
	if err != nil || key == nil {
		return nil, err
	}
	if kt, ok := s.keys.(*KeyTable); ok {
		if e, hit := kt.cache.get(ref); hit && bytes.Equal(e.key, key) {
			return e.cipher, nil
		}
	}
	return projector.NewKeyCipher(key)
}

// rowKey is the key row a readKeyed read brought with an event
// (keyJoinSQL): subject and keyID nil when the subject has no key row,
// wrapped nil when it was forgotten; epoch is the key epoch of the read's
// snapshot.
type rowKey struct {
	subject *string
	keyID   *string
	wrapped []byte
	epoch   pgtype.Int8
}

// open opens the sealed personal fields of events in place. rowKeys, when
// not nil, are the key rows a readKeyed read brought with each event, and
// their epoch the read's key epoch; epoch is a readEpoch read's (0: none).
// A subject whose key row the read did not bring is opened with its cached
// key when the cache trusts it at the read's key epoch (keyCache), in the
// same pass over the payload that finds the subject
// (projector.Personal.OpenStoredBy), and the other keys are read through
// db in one statement, once per subject. A forgotten subject's fields
// become null and the event is marked Forgotten. Events of types without
// personal fields, and those with nothing sealed, are left alone. envs are
// the events' envelopes kept apart from their payloads: each opens where
// it is, or, for a type this registry does not declare personal, is put
// back in its payload, as a read of a registry without personal types
// does (row.payload).
func (s *Store) open(ctx context.Context, db DBTX, events []projector.Event, rowKeys []rowKey, envs apartEnvelopes, epoch int64) error {
	type sealed struct {
		i      int
		ref    SubjectRef
		cipher *projector.KeyCipher // nil: forgotten
		fetch  bool                 // the key is read by DataKeys
	}
	var todo []sealed
	var refs []SubjectRef
	var seen map[SubjectRef]bool
	kt, _ := s.keys.(*KeyTable)
	if kt == nil {
		rowKeys, epoch = nil, 0
	}
	if len(rowKeys) > 0 {
		epoch = rowKeys[0].epoch.Int64 // one per statement
	}
	// trusted is the cipher of the event at hand's subject when the cache
	// trusts its key at the read's epoch, nil when it saw the subject
	// forgotten at that epoch; errUntrusted otherwise. The last subject's
	// answer is kept for the read: a stream's events mostly share one.
	var tenant string
	var last struct {
		ref    SubjectRef
		cipher *projector.KeyCipher
		ok     bool
	}
	trusted := func(id string) (*projector.KeyCipher, error) {
		if last.ok && last.ref.ID == id && last.ref.Tenant == tenant {
			return last.cipher, nil
		}
		ref := SubjectRef{Tenant: tenant, ID: id}
		if e, ok := kt.cache.trusted(ref, epoch); ok {
			last.ref, last.cipher, last.ok = ref, e.cipher, true
			return e.cipher, nil
		}
		if kt.cache.forgottenAt(ref, epoch) {
			last.ref, last.cipher, last.ok = ref, nil, true
			return nil, nil
		}
		return nil, errUntrusted
	}
	var personal typePersonal
	for i := range events {
		ev := &events[i]
		p, ok := personal.of(s.registry, ev.Type)
		env := envs.of(i)
		if !ok {
			if env != nil {
				data, err := projector.AttachEnvelope(ev.Data, env)
				if err != nil {
					return fmt.Errorf("event %s (%s of %s): %w", ev.ID, ev.Type, ev.Stream, err)
				}
				ev.Data = data
			}
			continue
		}
		// A readEpoch read's opening finds the sealed fields in its own
		// pass (nothing sealed: the payload comes back as it is), so only
		// the other reads scan for them first: a sealed payload is not
		// read once more just to learn that it is.
		opensInPass := epoch > 0 && (rowKeys == nil || rowKeys[i].keyID == nil)
		if !opensInPass && env == nil && !projector.IsSealed(ev.Data) {
			continue
		}
		t := sealed{i: i, ref: SubjectRef{Tenant: ev.Stream.Tenant}}
		switch {
		case rowKeys != nil && rowKeys[i].keyID != nil:
			// The read found the key row of the subject the payload names.
			rk := rowKeys[i]
			t.ref.ID = *rk.subject
			if rk.wrapped != nil {
				e, err := kt.unwrapAt(t.ref, *rk.keyID, rk.wrapped, rk.epoch.Int64)
				if err != nil {
					return fmt.Errorf("event %s (%s of %s): %w", ev.ID, ev.Type, ev.Stream, err)
				}
				t.cipher = e.cipher
			} else { // forgotten: no key
				kt.cache.sawForgotten(t.ref, rk.epoch.Int64)
			}
			todo = append(todo, t)
			continue
		case epoch > 0:
			tenant = ev.Stream.Tenant
			// In place: a read's payloads are pgx's fresh slices, its own.
			data, id, forgotten, err := p.OpenStoredApartByInPlace(ev.Data, env, trusted)
			switch {
			case err == nil:
				ev.Data, ev.Forgotten = data, forgotten
				continue
			case env == nil && !projector.IsSealed(ev.Data):
				// Nothing sealed (data is as it was on an error): left
				// alone, whatever its subject field holds.
				continue
			case id == "":
				return fmt.Errorf("event %s (%s): %w", ev.ID, ev.Type, err)
			case errors.Is(err, errUntrusted):
			case errors.Is(err, projector.ErrSealed):
				// A trusted key of a transaction that rolled back
				// (keyCache): read the subject's key row.
				kt.cache.drop(SubjectRef{Tenant: tenant, ID: id})
				last.ok = false
			default:
				return fmt.Errorf("event %s (%s of %s): %w", ev.ID, ev.Type, ev.Stream, err)
			}
			t.ref.ID = id
		default:
			id, err := p.SubjectOf(ev.Data)
			if err != nil {
				return fmt.Errorf("event %s (%s): %w", ev.ID, ev.Type, err)
			}
			t.ref.ID = id
		}
		t.fetch = true
		if !seen[t.ref] {
			if seen == nil {
				seen = map[SubjectRef]bool{}
			}
			seen[t.ref] = true
			refs = append(refs, t.ref)
		}
		todo = append(todo, t)
	}
	if epoch > 0 {
		kt.sawEpoch(epoch)
	}
	if len(todo) == 0 {
		return nil
	}
	ciphers, err := s.readKeyCiphers(ctx, db, kt, refs)
	if err != nil {
		return err
	}
	for _, t := range todo {
		ev := &events[t.i]
		if t.fetch {
			t.cipher = ciphers[t.ref]
		}
		data, forgotten, err := projector.OpenStoredApart(ev.Data, envs.of(t.i), t.ref.ID, t.cipher)
		if err != nil {
			return fmt.Errorf("event %s (%s of %s): %w", ev.ID, ev.Type, ev.Stream, err)
		}
		ev.Data, ev.Forgotten = data, forgotten
	}
	return nil
}

// typePersonal remembers the personal declaration of the last event type
// a loop looked up: the registry's lookup takes its lock, and a batch's
// lines mostly share a few types.
type typePersonal struct {
	typ      string
	p        projector.Personal
	declared bool // typ declares personal fields
	seen     bool // typ was looked up
}

// personalOf is t.of's declaration alone (the zero Personal: nothing).
func personalOf(t *typePersonal, reg *projector.Registry, typ string) projector.Personal {
	p, _ := t.of(reg, typ)
	return p
}

// of returns typ's declaration and whether it declares personal fields.
func (t *typePersonal) of(reg *projector.Registry, typ string) (projector.Personal, bool) {
	if !t.seen || t.typ != typ {
		t.typ, t.seen = typ, true
		t.p, t.declared = reg.PersonalOf(typ)
	}
	return t.p, t.declared
}

// errUntrusted: the cache does not trust a subject's key at a read's
// epoch; the read fetches it.
var errUntrusted = errors.New("no trusted cached key")

// readKeyCiphers reads the keys of refs through db, in one statement, and
// returns their ciphers; a forgotten subject, or one without a key, is
// absent. With the store's key table the ciphers come from its cache and
// the entries are confirmed at the statement's key epoch.
func (s *Store) readKeyCiphers(ctx context.Context, db DBTX, kt *KeyTable, refs []SubjectRef) (map[SubjectRef]*projector.KeyCipher, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	ciphers := make(map[SubjectRef]*projector.KeyCipher, len(refs))
	if kt != nil {
		entries, err := kt.dataKeys(ctx, db, refs)
		if err != nil {
			return nil, err
		}
		for ref, e := range entries {
			ciphers[ref] = e.cipher
		}
		return ciphers, nil
	}
	keys, err := s.keys.DataKeys(ctx, db, refs)
	if err != nil {
		return nil, err
	}
	for ref, key := range keys {
		if ciphers[ref], err = projector.NewKeyCipher(key); err != nil {
			return nil, fmt.Errorf("data key of subject %s: %w", ref, err)
		}
	}
	return ciphers, nil
}

// readKeys returns which reads to use (readMode) and their key
// parameters. A registry without personal fields, or keys not in the
// store's own key table, read plain; otherwise a process that has seen no
// key epoch yet reads each sealed event's key row with it (readKeyed), and
// one that has reads the key epoch alone (readEpoch): its cache holds the
// keys a read confirmed at that epoch, usually the ones the read needs.
func (s *Store) readKeys() (readMode, []any) {
	kt, ok := s.keys.(*KeyTable)
	if !ok || !s.registry.HasPersonal() {
		return readPlain, nil
	}
	if kt.knownEpoch() > 0 {
		return readEpoch, nil
	}
	types, subjects := s.registry.PersonalSubjects()
	return readKeyed, []any{types, subjects}
}

// OpenEvents opens the sealed personal fields of events read from the
// events table by a package's own query (the store's reads do it
// themselves), reading keys through db. A forgotten subject's fields
// become null and the event is marked Forgotten; see docs/privacy.md.
func (s *Store) OpenEvents(ctx context.Context, db DBTX, events []projector.Event) error {
	return s.open(ctx, db, events, nil, nil, 0)
}

// SealTx seals the fields p declares personal in data, a JSON object of
// tenant, under the key of the subject its p.Subject field names, inside tx
// (creating the key with tx, as an append does): what a copy of personal
// data outside the events — an aggregate's snapshot, a saga's state —
// stores instead of the clear values, so forgetting the subject reaches it
// too. A forgotten subject's fields are written as null. [Store.OpenData]
// opens the result.
func (s *Store) SealTx(ctx context.Context, tx pgx.Tx, tenant string, p projector.Personal, data json.RawMessage) (json.RawMessage, error) {
	id, err := sealSubject(p, data)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	c, err := s.dataKeyCipher(ctx, tx, SubjectRef{Tenant: tenant, ID: id})
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return p.SealWith(data, id, c)
}

// OpenData opens what [Store.SealTx] sealed, reading the subject's key
// through db: forgotten reports that the subject was forgotten and its
// fields are null. Data with nothing sealed comes back as it is.
func (s *Store) OpenData(ctx context.Context, db DBTX, tenant string, p projector.Personal, data json.RawMessage) (out json.RawMessage, forgotten bool, err error) {
	if !projector.IsSealed(data) {
		return data, false, nil
	}
	id, err := p.SubjectOf(data)
	if err != nil {
		return nil, false, fmt.Errorf("open: %w", err)
	}
	ref := SubjectRef{Tenant: tenant, ID: id}
	keys, err := s.keys.DataKeys(ctx, db, []SubjectRef{ref})
	if err != nil {
		return nil, false, fmt.Errorf("open: %w", err)
	}
	c, err := cipherFor(keys[ref])
	if err != nil {
		return nil, false, fmt.Errorf("open: %w", err)
	}
	return projector.OpenWith(data, id, c)
}

// cipherFor returns a key's cipher, nil for no key (forgotten).
func cipherFor(key []byte) (*projector.KeyCipher, error) {
	if key == nil {
		return nil, nil
	}
	return projector.NewKeyCipher(key)
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
