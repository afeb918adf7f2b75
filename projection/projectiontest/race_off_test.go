//go:build !race

package projectiontest_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
