package live

import "github.com/projectorhq/projector"

// DroppedClients counts the connected clients the hub has dropped (a
// buffer behind) whose streams have not ended yet: a test that appends
// until a stalled client is dropped stops there.
func (f *Feed) DroppedClients() int {
	h := f.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for c := range h.clients {
		c.mu.Lock()
		if c.dropped != "" {
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// SetJoining has f run hook between a stream's catch-up read and its
// joining the fan-out.
func SetJoining(f *Feed, hook func()) { f.joining = hook }

// FannedOut returns the last position f's consumer fanned out, and whether
// it fanned out anything yet.
func (f *Feed) FannedOut() (projector.Position, bool) {
	h := f.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last, h.known
}
