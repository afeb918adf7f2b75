package live

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
