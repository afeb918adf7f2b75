package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
)

// DefaultRewrapBatch is how many data keys [KeyTable.Rewrap] rewraps per
// transaction when RewrapOptions.BatchSize is 0.
const DefaultRewrapBatch = 500

// MaxRewrapBatch bounds RewrapOptions.BatchSize.
const MaxRewrapBatch = 10000

// ErrRewrapUnsupported: the store's keys are not the default key table (a
// KMS-backed [KeyStore]): rotate the wrapping key in the KMS.
var ErrRewrapUnsupported = errors.New("projector: the key store is not the default key table; rotate the key in the key store itself")

// RewrapOptions tunes [KeyTable.Rewrap].
type RewrapOptions struct {
	// BatchSize is how many keys one transaction rewraps: 1 to
	// [MaxRewrapBatch], 0 for [DefaultRewrapBatch].
	BatchSize int
	// Progress, when set, is called after each committed batch with the
	// totals so far.
	Progress func(RewrapResult)
}

// RewrapResult is what a rewrap did.
type RewrapResult struct {
	// MasterKeyID is the master key the keys were rewrapped under.
	MasterKeyID string
	// Pending is how many live keys were wrapped by other master keys when
	// the rewrap started, by master key id.
	Pending map[string]int64
	// Rewrapped is how many keys this run rewrapped.
	Rewrapped int64
	// Forgotten is how many keys were forgotten between the rewrap's read
	// and its write: left forgotten, not rewrapped.
	Forgotten int64
	// Batches is how many batches committed, counting the one-key
	// transactions that rewrap a key an append held during its batch.
	Batches int
	// Remaining is how many live keys are still wrapped by other master
	// keys at the end: created meanwhile by a process still running with
	// an old master key as its master key. Run the rewrap again once every
	// process has the new one.
	Remaining int64
}

// rewrapRow is a key row a rewrap batch read.
type rewrapRow struct {
	tenant, subject, keyID string
	wrapped                []byte
	// next is the data key wrapped by the master key, to write.
	next []byte
}

// Rewrap wraps every live data key that another master key wrapped under
// the table's master key, in batches of one transaction each, while
// appends, reads and forgets go on. The data keys themselves do not
// change, so nothing sealed under them changes either.
//
// Each batch reads its rows, unwraps them with the old master key they
// name and writes them back rewrapped only where the row still holds the
// wrapped bytes it read: a forget that commits between the read and the
// write leaves the row forgotten. A batch locks only the rows no other
// transaction holds, without waiting; a row an append holds (FOR SHARE,
// until it ends) is rewrapped after the batch in a transaction of its own,
// which waits for the append holding no other key row: a batch and an
// append never deadlock, however many subjects the append seals for. A rewrap that stops (a crash, a cancelled
// context) has committed whole batches only; running it again goes on
// where it stopped, and running it when nothing is left is a no-op.
//
// Before it changes anything it checks that every master key id it will
// meet is the master key or an old one, failing with [ErrUnknownMasterKey]
// otherwise, and that each old key opens one of its keys, failing with
// [ErrMasterKeyChanged] when one does not (wrong key material under that
// id); nothing is changed then.
func (k *KeyTable) Rewrap(ctx context.Context, pool *pgxpool.Pool, opts RewrapOptions) (RewrapResult, error) {
	if k.master == nil {
		return RewrapResult{}, fmt.Errorf("rewrap: %w", ErrNoMasterKey)
	}
	batch := opts.BatchSize
	if batch == 0 {
		batch = DefaultRewrapBatch
	}
	if batch < 1 || batch > MaxRewrapBatch {
		return RewrapResult{}, fmt.Errorf("rewrap: batch size %d is out of range 1–%d", opts.BatchSize, MaxRewrapBatch)
	}
	res := RewrapResult{MasterKeyID: k.master.id}
	var err error
	if res.Pending, err = k.checkRewrap(ctx, pool); err != nil {
		return res, err
	}
	if len(res.Pending) == 0 {
		return res, nil
	}
	// A key created behind the pass's position by a process still wrapping
	// with an old key is picked up by another pass; a few at most.
	for range 3 {
		before := res.Rewrapped
		if err := k.rewrapPass(ctx, pool, batch, &res, opts.Progress); err != nil {
			return res, err
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+k.table+`
			WHERE wrapped IS NOT NULL AND master_key_id <> $1`, k.master.id).Scan(&res.Remaining); err != nil {
			return res, fmt.Errorf("rewrap: count the keys left: %w", err)
		}
		if res.Remaining == 0 || res.Rewrapped == before {
			break
		}
	}
	return res, nil
}

// checkRewrap counts the live keys wrapped by other master keys, by id,
// and checks that the table's keys open one of each.
func (k *KeyTable) checkRewrap(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT DISTINCT ON (master_key_id) master_key_id, tenant_id, subject, wrapped,
			count(*) OVER (PARTITION BY master_key_id)
		FROM `+k.table+` WHERE wrapped IS NOT NULL AND master_key_id <> $1
		ORDER BY master_key_id, tenant_id, subject`, k.master.id)
	if err != nil {
		return nil, fmt.Errorf("rewrap: read the keys: %w", err)
	}
	pending := map[string]int64{}
	var unknown []string
	var r rewrapRow
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&r.keyID, &r.tenant, &r.subject, &r.wrapped, &n}, func() error {
		pending[r.keyID] = n
		m, ok := k.old[r.keyID]
		if !ok {
			unknown = append(unknown, fmt.Sprintf("%s (%d keys)", projector.Printable(r.keyID), n))
			return nil
		}
		if _, err := m.unwrap(SubjectRef{Tenant: r.tenant, ID: r.subject}, r.keyID, r.wrapped); err != nil {
			return fmt.Errorf("rewrap: %w; nothing was rewrapped", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("%w: data keys are wrapped by master key %s, which is neither the master key (%q) nor among the old ones (%s); nothing was rewrapped",
			ErrUnknownMasterKey, strings.Join(unknown, ", "), k.master.id, OldMasterKeysEnv)
	}
	return pending, nil
}

// rewrapPass rewraps the keys not wrapped by the master key, in key order,
// one batch per transaction.
func (k *KeyTable) rewrapPass(ctx context.Context, pool *pgxpool.Pool, batch int, res *RewrapResult, progress func(RewrapResult)) error {
	var after rewrapRow // tenants are never empty: ("", "") is before every key
	for {
		var n, done int64
		var busy []rewrapRow
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			n, done, busy, after, err = k.rewrapBatch(ctx, tx, batch, after, res.Batches+1)
			return err
		})
		if err != nil {
			return fmt.Errorf("rewrap: %w", err)
		}
		if n == 0 {
			return nil
		}
		res.Batches++
		res.Rewrapped += done
		res.Forgotten += n - done - int64(len(busy))
		if progress != nil {
			progress(*res)
		}
		// The keys an append held: each in a transaction of its own,
		// which waits for the append holding no other key row.
		for _, r := range busy {
			var done int64
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				done, err = k.rewrapRows(ctx, tx, []rewrapRow{r})
				return err
			})
			if err != nil {
				return fmt.Errorf("rewrap: %w", err)
			}
			res.Batches++
			res.Rewrapped += done
			res.Forgotten += 1 - done
			if progress != nil {
				progress(*res)
			}
		}
	}
}

// rewrapBatch rewraps up to batch keys after the key after, inside tx: it
// returns how many it read and how many it rewrapped, the ones it left
// because another transaction held them (busy), and the last one read.
func (k *KeyTable) rewrapBatch(ctx context.Context, tx pgx.Tx, batch int, after rewrapRow, number int) (read, rewrapped int64, busy []rewrapRow, last rewrapRow, err error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, subject, master_key_id, wrapped FROM `+k.table+`
		WHERE (tenant_id, subject) > ($1, $2) AND wrapped IS NOT NULL AND master_key_id <> $3
		ORDER BY tenant_id, subject LIMIT $4`, after.tenant, after.subject, k.master.id, batch)
	if err != nil {
		return 0, 0, nil, after, fmt.Errorf("read the keys: %w", err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (rewrapRow, error) {
		var r rewrapRow
		return r, row.Scan(&r.tenant, &r.subject, &r.keyID, &r.wrapped)
	})
	if err != nil {
		return 0, 0, nil, after, fmt.Errorf("read the keys: %w", err)
	}
	if len(got) == 0 {
		return 0, 0, nil, after, nil
	}
	for i := range got {
		if err := k.rewrapKey(&got[i]); err != nil {
			return 0, 0, nil, after, err
		}
	}
	if k.rewrapHook != nil {
		if err := k.rewrapHook(ctx, number); err != nil {
			return 0, 0, nil, after, err
		}
	}
	// The batch locks the rows no one holds, never waiting: an append
	// holds its subjects' key rows FOR SHARE until it ends, and a batch
	// that waited for one of them while holding others could close a cycle
	// with an append that seals for several subjects (PostgreSQL would
	// fail one of the two with a deadlock, 40P01). The rows held are
	// rewrapped afterwards, one per transaction.
	lockRows, err := tx.Query(ctx, `SELECT k.tenant_id, k.subject FROM `+k.table+` k
		JOIN unnest($1::text[], $2::text[]) AS u(tenant_id, subject) USING (tenant_id, subject)
		FOR UPDATE OF k SKIP LOCKED`, column(got, func(r rewrapRow) string { return r.tenant }), column(got, func(r rewrapRow) string { return r.subject }))
	if err != nil {
		return 0, 0, nil, after, fmt.Errorf("lock the keys: %w", err)
	}
	locked := map[SubjectRef]bool{}
	var ref SubjectRef
	if _, err := pgx.ForEachRow(lockRows, []any{&ref.Tenant, &ref.ID}, func() error { locked[ref] = true; return nil }); err != nil {
		return 0, 0, nil, after, fmt.Errorf("lock the keys: %w", err)
	}
	mine := make([]rewrapRow, 0, len(locked))
	for _, r := range got {
		if locked[SubjectRef{Tenant: r.tenant, ID: r.subject}] {
			mine = append(mine, r)
		} else {
			busy = append(busy, r)
		}
	}
	n, err := k.rewrapRows(ctx, tx, mine)
	if err != nil {
		return 0, 0, nil, after, err
	}
	return int64(len(got)), n, busy, got[len(got)-1], nil
}

// rewrapKey sets r.next, r's data key wrapped by the master key.
func (k *KeyTable) rewrapKey(r *rewrapRow) error {
	ref := SubjectRef{Tenant: r.tenant, ID: r.subject}
	m, ok := k.old[r.keyID]
	if !ok {
		return fmt.Errorf("%w: the data key of subject %s is wrapped by master key %s, which is not among the old ones (%s)",
			ErrUnknownMasterKey, ref, projector.Printable(r.keyID), OldMasterKeysEnv)
	}
	key, err := m.unwrap(ref, r.keyID, r.wrapped)
	if err != nil {
		return err
	}
	r.next, err = k.master.wrap(ref, key)
	return err
}

// rewrapRows writes rows' keys rewrapped (next), in tx, where a row still
// holds the wrapped bytes the rewrap read: a row forgotten since (its
// wrapped NULL) or rewrapped by another run is left as it is. It returns
// how many it wrote. A batch's rows are locked already; a row another
// transaction held, rewrapped alone, is waited for here.
func (k *KeyTable) rewrapRows(ctx context.Context, tx pgx.Tx, rows []rewrapRow) (int64, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	tag, err := tx.Exec(ctx, `UPDATE `+k.table+` AS k SET master_key_id = $3, wrapped = u.new
		FROM unnest($1::text[], $2::text[], $4::bytea[], $5::bytea[]) AS u(tenant_id, subject, old, new)
		WHERE k.tenant_id = u.tenant_id AND k.subject = u.subject AND k.wrapped = u.old`,
		column(rows, func(r rewrapRow) string { return r.tenant }), column(rows, func(r rewrapRow) string { return r.subject }),
		k.master.id, column(rows, func(r rewrapRow) []byte { return r.wrapped }), column(rows, func(r rewrapRow) []byte { return r.next }))
	if err != nil {
		return 0, fmt.Errorf("write the rewrapped keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// column returns f of each row.
func column[T any](rows []rewrapRow, f func(rewrapRow) T) []T {
	out := make([]T, len(rows))
	for i, r := range rows {
		out[i] = f(r)
	}
	return out
}

// RewrapKeys rewraps the data keys of the store's key table under its
// master key: see [KeyTable.Rewrap]. It fails with [ErrRewrapUnsupported]
// for a key store of another kind.
func (s *Store) RewrapKeys(ctx context.Context, opts RewrapOptions) (RewrapResult, error) {
	kt, ok := s.keys.(*KeyTable)
	if !ok {
		return RewrapResult{}, ErrRewrapUnsupported
	}
	return kt.Rewrap(ctx, s.pool, opts)
}
