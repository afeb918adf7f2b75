package postgres

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projectorhq/projector"
)

// MasterKeyEnv is the environment variable [New] reads the master key from
// when Config.MasterKey is nil; see [ParseMasterKey] for its format.
const MasterKeyEnv = "PROJECTOR_MASTER_KEY"

// OldMasterKeysEnv is the environment variable [New] reads the old master
// keys from when Config.OldMasterKeys is nil: a comma-separated list of
// ID:KEY ([ParseMasterKeys]). Old keys only unwrap data keys, never wrap new
// ones; they are what a process needs while a master-key rotation is under
// way (docs/privacy.md, "Rotating the master key").
const OldMasterKeysEnv = "PROJECTOR_OLD_MASTER_KEYS"

// ErrNoMasterKey: personal data must be sealed or opened and no master key
// was given (Config.MasterKey, or PROJECTOR_MASTER_KEY). Nothing was
// written.
var ErrNoMasterKey = errors.New("projector: no master key for personal data (set PROJECTOR_MASTER_KEY)")

// ErrMasterKeyChanged: a subject's data key was wrapped by another master
// key than the one this process has — a different key id, or the same id
// with different key material. The key is never used and nothing is
// written; run with the master key the data keys were made with.
var ErrMasterKeyChanged = errors.New("projector: master key changed")

// ErrUnknownMasterKey: data keys are wrapped by a master key this process
// has neither as its master key nor among its old ones, so they cannot be
// rewrapped. Nothing was changed.
var ErrUnknownMasterKey = errors.New("projector: unknown master key")

// SubjectRef names a data subject: its id within a tenant.
type SubjectRef struct {
	Tenant string
	ID     string
}

// String renders the subject as tenant/id for errors and logs.
func (s SubjectRef) String() string {
	return projector.Printable(s.Tenant) + "/" + projector.Printable(s.ID)
}

// Validate reports whether PostgreSQL can store the reference exactly; the
// error matches [projector.ErrInvalidPayload].
func (s SubjectRef) Validate() error {
	if s.ID == "" {
		return fmt.Errorf("%w: subject %s needs an id", projector.ErrInvalidPayload, s)
	}
	if s.Tenant == "" {
		// No default on purpose: forgetting is for good, and the wrong
		// tenant's subject must not be the one an omission picks.
		return fmt.Errorf("%w: subject %s needs a tenant (the subject of streams made with projector.Stream is the system tenant's: Tenant: projector.SystemTenant)", projector.ErrInvalidPayload, s)
	}
	for _, v := range []string{s.Tenant, s.ID} {
		if err := projector.ValidText(v); err != nil {
			return fmt.Errorf("%w: subject %s: %w", projector.ErrInvalidPayload, s, err)
		}
	}
	return nil
}

// KeyStore holds the data subjects' keys. The default is [KeyTable], a
// PostgreSQL table wrapped by a master key from the environment; a KMS
// plugs in by implementing it (docs/privacy.md, "Plugging in a KMS").
//
// Destroying a key must be final and must commit with tx: the forgotten
// event is appended in the same transaction.
type KeyStore interface {
	// DataKey returns subject's data key for sealing, creating one inside
	// tx when the subject has none, so the key commits with the events
	// sealed under it; two transactions racing for a new subject must end
	// with one key. A forgotten subject returns a nil key and no error.
	// The key it returns must stay the subject's until tx ends: a Destroy
	// of it in another transaction waits for tx (the key table locks the
	// row FOR SHARE), so nothing tx writes with the key in the clear, such
	// as an inline projection's row, commits after the forget.
	DataKey(ctx context.Context, tx pgx.Tx, subject SubjectRef) ([]byte, error)
	// DataKeys returns the keys of subjects for opening their fields. A
	// subject that was forgotten, or has no key, is absent from the map.
	DataKeys(ctx context.Context, db DBTX, subjects []SubjectRef) (map[SubjectRef][]byte, error)
	// Destroy destroys subject's key inside tx. It fails matching
	// [projector.ErrNotFound] for a subject without a key and
	// [projector.ErrInvalidTransition] for one already forgotten; either
	// way nothing changed.
	Destroy(ctx context.Context, tx pgx.Tx, subject SubjectRef) (time.Time, error)
}

// MasterKey wraps the data keys [KeyTable] stores. Its ID is recorded with
// every wrapped key, so a process started with another master key gets
// [ErrMasterKeyChanged], never garbage.
type MasterKey struct {
	id   string
	aead cipher.AEAD
}

var masterKeyID = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// ParseMasterKey parses a master key written as ID:KEY, where ID names the
// key (1–64 letters, digits, '.', '_' or '-'; recorded with every data key
// it wraps) and KEY is 32 random bytes in standard base64, such as
//
//	PROJECTOR_MASTER_KEY=2026-12:$(openssl rand -base64 32)
//
// The error never holds the key material.
func ParseMasterKey(s string) (*MasterKey, error) {
	id, enc, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || !masterKeyID.MatchString(id) {
		return nil, errors.New("master key: want ID:BASE64KEY, the id 1–64 letters, digits, '.', '_' or '-'")
	}
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil || len(key) != projector.DataKeySize {
		return nil, fmt.Errorf("master key %q: the key must be %d bytes in standard base64 (openssl rand -base64 32)", id, projector.DataKeySize)
	}
	return NewMasterKey(id, key)
}

// ParseMasterKeys parses a comma-separated list of master keys, each
// ID:KEY as [ParseMasterKey] takes it, such as the value of
// PROJECTOR_OLD_MASTER_KEYS. Empty items are ignored; an id given twice is
// an error. The error never holds key material.
func ParseMasterKeys(s string) ([]*MasterKey, error) {
	var out []*MasterKey
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		m, err := ParseMasterKey(item)
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", len(out)+1, err)
		}
		if seen[m.id] {
			return nil, fmt.Errorf("master key %q is listed twice", m.id)
		}
		seen[m.id] = true
		out = append(out, m)
	}
	return out, nil
}

// NewMasterKey returns the master key id with 32 bytes of key material.
func NewMasterKey(id string, key []byte) (*MasterKey, error) {
	if !masterKeyID.MatchString(id) {
		return nil, fmt.Errorf("master key id %s: want 1–64 letters, digits, '.', '_' or '-'", projector.Printable(id))
	}
	if len(key) != projector.DataKeySize {
		return nil, fmt.Errorf("master key %q: %d bytes, want %d", id, len(key), projector.DataKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &MasterKey{id: id, aead: aead}, nil
}

// ID returns the key's id.
func (m *MasterKey) ID() string { return m.id }

// wrap encrypts a data key for subject; the subject is the additional data,
// so a wrapped key copied to another subject's row does not open.
func (m *MasterKey) wrap(subject SubjectRef, key []byte) ([]byte, error) {
	out := make([]byte, m.aead.NonceSize(), m.aead.NonceSize()+len(key)+m.aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, fmt.Errorf("wrap data key: %w", err)
	}
	return m.aead.Seal(out, out, key, wrapAD(subject)), nil
}

func (m *MasterKey) unwrap(subject SubjectRef, keyID string, wrapped []byte) ([]byte, error) {
	if keyID != m.id {
		return nil, fmt.Errorf("%w: the data key of subject %s was wrapped by master key %s, this process has %q and no old master key (%s) with that id",
			ErrMasterKeyChanged, subject, projector.Printable(keyID), m.id, OldMasterKeysEnv)
	}
	n := m.aead.NonceSize()
	if len(wrapped) < n+m.aead.Overhead() {
		return nil, fmt.Errorf("%w: the data key of subject %s is damaged (%d bytes)", ErrMasterKeyChanged, subject, len(wrapped))
	}
	key, err := m.aead.Open(nil, wrapped[:n], wrapped[n:], wrapAD(subject))
	if err != nil || len(key) != projector.DataKeySize {
		return nil, fmt.Errorf("%w: master key %q does not open the data key of subject %s: the key material changed under the same id, or the row was altered",
			ErrMasterKeyChanged, m.id, subject)
	}
	return key, nil
}

func wrapAD(s SubjectRef) []byte {
	return []byte("projector-data-key\x00" + s.Tenant + "\x00" + s.ID)
}

// KeyTable is the default [KeyStore]: the table projector_subject_keys in
// the store's schema, each subject's random 32-byte AES key wrapped with
// AES-256-GCM by a [MasterKey] kept outside the database. Forgetting sets
// the wrapped key to NULL, leaving a tombstone.
type KeyTable struct {
	table  string // quoted, schema-qualified
	master *MasterKey
	// old are the old master keys by id: they unwrap, never wrap.
	old   map[string]*MasterKey
	cache *keyCache // nil: none
	// epochTable is the key epoch's table (migration 26), quoted; epoch is
	// the key epoch the latest read of this process saw, 0 before the
	// first (see keyCache).
	epochTable string
	epoch      atomic.Int64
	// rewrapHook, when set (tests), runs between a rewrap batch's read of
	// the key rows and its update of them.
	rewrapHook func(ctx context.Context, batch int) error
}

// NewKeyTable returns the key table of schema; master may be nil, in which
// case sealing and opening fail with [ErrNoMasterKey] and only forgetting
// works. old are master keys that data keys may still be wrapped by, from
// before a rotation: they open those keys, and [KeyTable.Rewrap] rewraps
// them under master. An old key needs a master key, and no id may be given
// twice.
func NewKeyTable(schema string, master *MasterKey, old ...*MasterKey) (*KeyTable, error) {
	schema = schemaOrDefault(schema)
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	k := &KeyTable{table: quoteIdent(schema) + ".projector_subject_keys", epochTable: quoteIdent(schema) + ".projector_key_epoch",
		master: master, cache: newKeyCache(DefaultKeyCacheSize)}
	if len(old) > 0 && master == nil {
		return nil, fmt.Errorf("%w: old master keys are given but no master key to rewrap their data keys under", ErrNoMasterKey)
	}
	for _, m := range old {
		if m == nil {
			return nil, errors.New("key table: nil old master key")
		}
		if m.id == master.id || k.old[m.id] != nil {
			return nil, fmt.Errorf("key table: master key id %q is given twice (old keys must have ids of their own)", m.id)
		}
		if k.old == nil {
			k.old = map[string]*MasterKey{}
		}
		k.old[m.id] = m
	}
	return k, nil
}

// masterFor returns the master key that unwraps data keys wrapped by the
// master key keyID: the master key, or an old one with that id. With none,
// it returns the master key, whose unwrap explains the mismatch.
func (k *KeyTable) masterFor(keyID string) *MasterKey {
	if m, ok := k.old[keyID]; ok {
		return m
	}
	return k.master
}

// DataKey implements [KeyStore]. The common case — the subject has a key —
// is one statement; the statement that creates the key reads the existing
// one in the same round trip.
func (k *KeyTable) DataKey(ctx context.Context, tx pgx.Tx, subject SubjectRef) ([]byte, error) {
	if k.master == nil {
		return nil, ErrNoMasterKey
	}
	fresh, err := projector.NewDataKey()
	if err != nil {
		return nil, err
	}
	wrapped, err := k.master.wrap(subject, fresh)
	if err != nil {
		return nil, err
	}
	// Found, or inserted; when neither, another transaction inserted the
	// row after this statement's snapshot was taken and committed while
	// the insert waited on it: the next statement sees it. A found row is
	// locked FOR SHARE until tx ends: a forget's Destroy (an UPDATE of the
	// row) waits for this transaction, so what it writes with the key —
	// an inline projection's copy of the fields in the clear — is committed
	// and seen by the forget's own OnForgotten, never committed after it.
	// A forget that committed first is seen through the lock (the row is
	// read again as it is once locked): the fields are written as null.
	sql := `WITH found AS (
		SELECT master_key_id, wrapped FROM ` + k.table + ` WHERE tenant_id = $1 AND subject = $2 FOR SHARE
	), ins AS (
		INSERT INTO ` + k.table + ` (tenant_id, subject, master_key_id, wrapped)
		SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT FROM found)
		ON CONFLICT (tenant_id, subject) DO NOTHING
		RETURNING master_key_id, wrapped
	)
	SELECT master_key_id, wrapped FROM found UNION ALL SELECT master_key_id, wrapped FROM ins`
	for range 3 {
		var keyID string
		var stored []byte
		err := tx.QueryRow(ctx, sql, subject.Tenant, subject.ID, k.master.id, wrapped).Scan(&keyID, &stored)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("data key of subject %s: %w", subject, err)
		}
		if stored == nil {
			k.cache.drop(subject)
			return nil, nil // forgotten
		}
		e, err := k.unwrap(subject, keyID, stored)
		return e.key, err
	}
	return nil, fmt.Errorf("data key of subject %s: no key found or created after three tries", subject)
}

// DataKeys implements [KeyStore].
func (k *KeyTable) DataKeys(ctx context.Context, db DBTX, subjects []SubjectRef) (map[SubjectRef][]byte, error) {
	entries, err := k.dataKeys(ctx, db, subjects)
	if err != nil || entries == nil {
		return nil, err
	}
	out := make(map[SubjectRef][]byte, len(entries))
	for ref, e := range entries {
		out[ref] = e.key
	}
	return out, nil
}

// dataKeys is DataKeys with each key's cache entry, confirmed at the key
// epoch of the statement's snapshot (keyCache). The statement brings the
// forgotten subjects' rows too, without a key: the cache remembers them
// as forgotten at that epoch, and they are absent from the result.
func (k *KeyTable) dataKeys(ctx context.Context, db DBTX, subjects []SubjectRef) (map[SubjectRef]cachedKey, error) {
	if len(subjects) == 0 {
		return nil, nil
	}
	tenants := make([]string, len(subjects))
	ids := make([]string, len(subjects))
	for i, s := range subjects {
		tenants[i], ids[i] = s.Tenant, s.ID
	}
	rows, err := db.Query(ctx, `SELECT k.tenant_id, k.subject, k.master_key_id, k.wrapped, (SELECT ep.epoch FROM `+k.epochTable+` ep)
		FROM `+k.table+` k
		JOIN unnest($1::text[], $2::text[]) AS s(tenant_id, subject) USING (tenant_id, subject)`, tenants, ids)
	if err != nil {
		return nil, fmt.Errorf("read data keys: %w", err)
	}
	out := make(map[SubjectRef]cachedKey, len(subjects))
	var ref SubjectRef
	var keyID string
	var wrapped []byte
	var epoch pgtype.Int8
	_, err = pgx.ForEachRow(rows, []any{&ref.Tenant, &ref.ID, &keyID, &wrapped, &epoch}, func() error {
		if wrapped == nil {
			k.cache.sawForgotten(ref, epoch.Int64)
			k.sawEpoch(epoch.Int64)
			return nil
		}
		e, err := k.unwrapAt(ref, keyID, wrapped, epoch.Int64)
		if err != nil {
			return err
		}
		out[ref] = e
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read data keys: %w", err)
	}
	return out, nil
}

// unwrapAt is unwrap for a key row a read saw at the key epoch epoch (0:
// unknown): the entry is confirmed at it, and it becomes the process's
// known epoch.
func (k *KeyTable) unwrapAt(subject SubjectRef, keyID string, wrapped []byte, epoch int64) (cachedKey, error) {
	e, err := k.unwrap(subject, keyID, wrapped)
	if err != nil || epoch <= 0 {
		return e, err
	}
	k.cache.confirm(subject, wrapped, epoch)
	e.epoch = epoch
	k.sawEpoch(epoch)
	return e, nil
}

// knownEpoch returns the key epoch the latest read of this process saw; 0
// before the first, when reads bring each sealed event's key row
// (readKeys).
func (k *KeyTable) knownEpoch() int64 { return k.epoch.Load() }

// sawEpoch makes epoch, a read's, the known epoch. The latest read wins,
// not the largest value: a forget that rolled back leaves behind a value
// no later snapshot has (each move takes a value of its own, migration
// 26), and a process that kept it would trust no cached key again and
// read the keys of every read in a statement of their own. An epoch is
// only ever compared for equality.
func (k *KeyTable) sawEpoch(epoch int64) {
	if epoch > 0 {
		k.epoch.Store(epoch)
	}
}

// unwrap returns the data key of subject's key row (master key keyID,
// wrapped bytes wrapped) and its cipher: from the cache when it holds that
// very row, unwrapped by the master key otherwise, and then cached.
func (k *KeyTable) unwrap(subject SubjectRef, keyID string, wrapped []byte) (cachedKey, error) {
	if e, ok := k.cache.lookup(subject, keyID, wrapped); ok {
		return e, nil
	}
	if k.master == nil {
		return cachedKey{}, ErrNoMasterKey
	}
	key, err := k.masterFor(keyID).unwrap(subject, keyID, wrapped)
	if err != nil {
		return cachedKey{}, err
	}
	c, err := projector.NewKeyCipher(key)
	if err != nil {
		return cachedKey{}, err
	}
	e := cachedKey{ref: subject, keyID: keyID, wrapped: wrapped, key: key, cipher: c}
	k.cache.put(e)
	return e, nil
}

// Destroy implements [KeyStore]. Two forgets racing for one subject meet on
// the row's lock: the second re-reads the row after the first commits and
// is told the subject is already forgotten.
func (k *KeyTable) Destroy(ctx context.Context, tx pgx.Tx, subject SubjectRef) (time.Time, error) {
	var at time.Time
	k.cache.drop(subject) // not needed for safety (see keyCache), but kept tidy
	err := tx.QueryRow(ctx, `UPDATE `+k.table+` SET wrapped = NULL, forgotten_at = now()
		WHERE tenant_id = $1 AND subject = $2 AND wrapped IS NOT NULL RETURNING forgotten_at`, subject.Tenant, subject.ID).Scan(&at)
	if err == nil {
		return at, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("destroy the key of subject %s: %w", subject, err)
	}
	err = tx.QueryRow(ctx, `SELECT forgotten_at FROM `+k.table+` WHERE tenant_id = $1 AND subject = $2`, subject.Tenant, subject.ID).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("subject %s has no personal data (no key): %w", subject, projector.ErrNotFound)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("destroy the key of subject %s: %w", subject, err)
	}
	return time.Time{}, fmt.Errorf("%w: subject %s was already forgotten at %s", projector.ErrInvalidTransition, subject, at.UTC().Format(time.RFC3339))
}
