//go:build !race

package projector_test

// raceBuild says whether this test binary was built with -race.
const raceBuild = false
