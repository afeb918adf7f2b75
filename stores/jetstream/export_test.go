package jetstream

// SetAfterAcks installs a hook run after a batch's acknowledgements all
// arrived and before the handler returns (so before the cursor commits):
// where the crash tests kill the relay.
func SetAfterAcks(r *Relay, f func()) { r.afterAcks = f }

// SetTailCheck turns the relay's look-up of events stored past its cursor
// on or off, so a test can show the duplicate it prevents.
func SetTailCheck(r *Relay, on bool) { r.noTailCheck = !on }
