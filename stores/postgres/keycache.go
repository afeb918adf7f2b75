package postgres

import (
	"bytes"
	"container/list"
	"sync"

	"github.com/projectorhq/projector"
)

// DefaultKeyCacheSize is how many unwrapped data keys a [KeyTable] keeps
// when Config.KeyCacheSize is 0.
const DefaultKeyCacheSize = 4096

// keyCache is a bounded LRU of unwrapped data keys, each remembered with
// the wrapped bytes it was unwrapped from. It is never trusted on its own:
//
//   - a read uses a cached key only when the read statement itself returned
//     the same wrapped bytes for the subject, so a key forgotten (its row's
//     wrapped set to NULL) before the read's snapshot is never used, in
//     whatever process the forget ran;
//   - an append seals under a cached key only together with a guard in the
//     insert's own statement that the subject's row still holds those
//     wrapped bytes (appendGuard); when it does not — the subject was
//     forgotten, or the key came from a transaction that rolled back — the
//     append writes nothing, drops the entry and starts over without the
//     cache.
//
// A read may also use an entry without seeing its key row, when the entry
// is trusted: its epoch is the key epoch (migration 26) of a snapshot in
// which a read saw the key row hold the entry's wrapped bytes, and the read
// at hand runs in a snapshot of that same epoch. Every statement that
// destroys a key moves the epoch in its own transaction, so no key was
// destroyed between the two snapshots, in either order. A read of a process
// that knows an epoch brings no key rows at all, only its snapshot's epoch
// (readEpoch), and reads the keys of the subjects it does not trust in a
// statement of its own, which confirms them at that statement's epoch. An
// entry a read saw in its own
// transaction's uncommitted key row may be trusted and then belong to no
// one, once that transaction rolls back: it opens nothing of the key that
// replaced it (the envelope is authenticated), and the read then drops it
// and reads the key row.
//
// The wrapped bytes hold a random nonce, so two keys never share them: a
// match means the very key row the entry was made from.
//
// The cache also remembers subjects a read found forgotten (their key row
// there, its wrapped NULL), each with the key epoch of that read's
// snapshot: a read at that same epoch takes the subject as forgotten
// without reading its key row again. Bringing a destroyed key back — an
// UPDATE of wrapped, or a DELETE and a new row — moves the epoch (a
// DELETE does, and the new row can only follow it), so the entry is never
// used across a move: after a forget commits no read opens the subject's
// fields (promise 19), and a key restored by hand is read again.
type keyCache struct {
	mu      sync.Mutex
	max     int
	order   *list.List // front: most recently used
	entries map[SubjectRef]*list.Element
	// forgotten maps subjects a read saw forgotten to that read's key
	// epoch; at most max of them, cleared when full.
	forgotten map[SubjectRef]int64
}

type cachedKey struct {
	ref     SubjectRef
	keyID   string // the master key's id
	wrapped []byte
	key     []byte
	cipher  *projector.KeyCipher // key's, set up once
	// epoch is the latest key epoch at which a read saw the key row hold
	// wrapped; 0 when none has (the entry came from an append).
	epoch int64
}

// newKeyCache returns a cache of at most size keys, or nil (no caching)
// for a size below 1.
func newKeyCache(size int) *keyCache {
	if size < 1 {
		return nil
	}
	return &keyCache{max: size, order: list.New(), entries: map[SubjectRef]*list.Element{}}
}

// get returns the subject's cached entry.
func (c *keyCache) get(ref SubjectRef) (cachedKey, bool) {
	if c == nil {
		return cachedKey{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[ref]
	if !ok {
		return cachedKey{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(cachedKey), true
}

// lookup returns the entry cached for exactly this wrapped key row.
func (c *keyCache) lookup(ref SubjectRef, keyID string, wrapped []byte) (cachedKey, bool) {
	e, ok := c.get(ref)
	if !ok || e.keyID != keyID || !bytes.Equal(e.wrapped, wrapped) {
		return cachedKey{}, false
	}
	return e, true
}

// trusted returns the subject's entry if a read saw its key row at epoch,
// the key epoch of the caller's snapshot.
func (c *keyCache) trusted(ref SubjectRef, epoch int64) (cachedKey, bool) {
	e, ok := c.get(ref)
	if !ok || epoch <= 0 || e.epoch != epoch {
		return cachedKey{}, false
	}
	return e, true
}

// confirm records that a read at epoch saw the subject's key row hold
// wrapped, if the entry was made from that row.
func (c *keyCache) confirm(ref SubjectRef, wrapped []byte, epoch int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[ref]
	if !ok {
		return
	}
	if e := el.Value.(cachedKey); bytes.Equal(e.wrapped, wrapped) {
		e.epoch = epoch
		el.Value = e
	}
}

// forgottenAt reports whether a read at epoch, the key epoch of the
// caller's snapshot, saw the subject forgotten.
func (c *keyCache) forgottenAt(ref SubjectRef, epoch int64) bool {
	if c == nil || epoch <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.forgotten[ref]
	return ok && e == epoch
}

// sawForgotten records that a read at epoch saw the subject's key row
// forgotten (wrapped NULL), and drops the subject's key if cached.
func (c *keyCache) sawForgotten(ref SubjectRef, epoch int64) {
	if c == nil || epoch <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[ref]; ok {
		c.order.Remove(el)
		delete(c.entries, ref)
	}
	if c.forgotten == nil || len(c.forgotten) >= c.max {
		// Cleared rather than ordered: an entry only saves a read of
		// a key row, and a full map means the epoch moved meanwhile or
		// the process reads more forgotten subjects than it caches.
		c.forgotten = map[SubjectRef]int64{}
	}
	c.forgotten[ref] = epoch
}

// put remembers e, evicting the least recently used entry when full.
func (c *keyCache) put(e cachedKey) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.forgotten, e.ref)
	if el, ok := c.entries[e.ref]; ok {
		el.Value = e
		c.order.MoveToFront(el)
		return
	}
	c.entries[e.ref] = c.order.PushFront(e)
	if c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(cachedKey).ref)
	}
}

// drop forgets the subject's entry.
func (c *keyCache) drop(ref SubjectRef) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.forgotten, ref)
	if el, ok := c.entries[ref]; ok {
		c.order.Remove(el)
		delete(c.entries, ref)
	}
}
