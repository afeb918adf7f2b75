package postgres

import (
	"sync"
	"sync/atomic"
)

// AppendWatch tells code in this process that appends went through the
// Store it came from: a dispatcher running beside the appending code uses
// it to look at the log within a millisecond of a commit instead of at its
// next poll, without LISTEN/NOTIFY (which serialises committing
// transactions: docs/performance.md has the figures) and without any
// statement on the append path. It is a hint, never a delivery: what an
// append wrote is still only read, gap-safely, from the log after its
// transaction committed, and appends from other processes or other Stores
// are seen by polling as before.
//
// A watch coalesces: however many appends happened since the last
// [AppendWatch.Take], C holds one signal and Take the newest transaction
// id. Close it when done; an unclosed watch costs every append a
// non-blocking send.
type AppendWatch struct {
	store  *Store
	ch     chan struct{}
	mu     sync.Mutex
	newest uint64
}

// watchers is the Store's set of watches, copied on change so an append
// reads it with one atomic load.
type watchers struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*AppendWatch]
}

// WatchAppends returns a watch of this Store's appends. See [AppendWatch].
func (s *Store) WatchAppends() *AppendWatch {
	w := &AppendWatch{store: s, ch: make(chan struct{}, 1)}
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	var list []*AppendWatch
	if cur := s.watch.list.Load(); cur != nil {
		list = append(list, *cur...)
	}
	list = append(list, w)
	s.watch.list.Store(&list)
	return w
}

// C receives a signal after one or more appends wrote their events (their
// transactions may not have committed yet).
func (w *AppendWatch) C() <-chan struct{} { return w.ch }

// Take returns the newest transaction id that appended since the last
// Take, and forgets it; 0 when none did.
func (w *AppendWatch) Take() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	tx := w.newest
	w.newest = 0
	return tx
}

// Close stops the watch. Safe to call more than once.
func (w *AppendWatch) Close() {
	s := w.store
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	cur := s.watch.list.Load()
	if cur == nil {
		return
	}
	list := make([]*AppendWatch, 0, len(*cur))
	for _, o := range *cur {
		if o != w {
			list = append(list, o)
		}
	}
	s.watch.list.Store(&list)
}

// appended signals every watch that transaction txID appended.
func (s *Store) appended(txID uint64) {
	list := s.watch.list.Load()
	if list == nil {
		return
	}
	for _, w := range *list {
		w.mu.Lock()
		w.newest = max(w.newest, txID)
		w.mu.Unlock()
		select {
		case w.ch <- struct{}{}:
		default: // a signal is pending already
		}
	}
}
