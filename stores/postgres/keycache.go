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
// The wrapped bytes hold a random nonce, so two keys never share them: a
// match means the very key row the entry was made from.
type keyCache struct {
	mu      sync.Mutex
	max     int
	order   *list.List // front: most recently used
	entries map[SubjectRef]*list.Element
}

type cachedKey struct {
	ref     SubjectRef
	keyID   string // the master key's id
	wrapped []byte
	key     []byte
	cipher  *projector.KeyCipher // key's, set up once
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

// put remembers e, evicting the least recently used entry when full.
func (c *keyCache) put(e cachedKey) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
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
	if el, ok := c.entries[ref]; ok {
		c.order.Remove(el)
		delete(c.entries, ref)
	}
}
