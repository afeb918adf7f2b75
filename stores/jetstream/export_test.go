package jetstream

// SetAfterAcks installs a hook run after a batch's acknowledgements all
// arrived and before the handler returns (so before the cursor commits):
// where the crash tests kill the relay.
func SetAfterAcks(r *Relay, f func()) { r.afterAcks = f }
