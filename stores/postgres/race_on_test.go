//go:build race

package postgres_test

// raceEnabled: the race detector slows this package's code five to ten
// times, so the largest data-volume tests run a smaller size under it
// (make test) and the size the issue names without it (make test-short).
const raceEnabled = true
