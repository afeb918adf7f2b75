package pgtest

import "os"

// EnvSoak names the variable that runs the crash, concurrency and soak
// tests at their full sizes (PROJECTOR_SOAK=1): more kills, more rounds,
// more events. Without it they run a smaller size that still reaches every
// state they check (a kill mid-step, a kill between commit and publish, …)
// at least once, so the default suite stays cheap on a loaded machine
// (every kill starts a -race child process) and a soak run before a
// release, or nightly, runs them many times over.
const EnvSoak = "PROJECTOR_SOAK"

// Soak reports whether PROJECTOR_SOAK asks for the full sizes.
func Soak() bool { return os.Getenv(EnvSoak) != "" && os.Getenv(EnvSoak) != "0" }

// SoakSize returns full under PROJECTOR_SOAK, else quick.
func SoakSize(quick, full int) int {
	if Soak() {
		return full
	}
	return quick
}
