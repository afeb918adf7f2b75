//go:build !race

package postgres_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
