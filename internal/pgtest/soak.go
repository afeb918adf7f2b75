package pgtest

import "os"

// EnvSoak, set to anything but "" or "0", runs the crash and concurrency
// tests at their full sizes: more events, more streams, more SIGKILL rounds.
// The default run keeps each of those tests proving its promise — real
// processes killed mid-work a few times, exactly-once and order checked —
// at a size that lets the whole suite finish well under ten minutes on a
// loaded two-core CI machine, where the suite is CPU-bound and only less
// work makes it faster. A soak run (before a release, after touching the
// dispatcher, the partitions or the rebuilds) looks for the rarer
// interleavings only many more rounds find.
const EnvSoak = "PROJECTOR_SOAK"

// Soak reports whether this run asked for the full sizes (EnvSoak).
func Soak() bool {
	v := os.Getenv(EnvSoak)
	return v != "" && v != "0"
}

// Size is small in the default run and full in a soak run (EnvSoak): the
// one place a test states both of its sizes.
func Size(small, full int) int {
	if Soak() {
		return full
	}
	return small
}
