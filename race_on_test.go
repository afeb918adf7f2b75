//go:build race

package projector_test

// raceBuild says whether this test binary was built with -race, so that
// the docs' snippets are compiled the same way and reuse the suite's
// build cache instead of compiling every dependency a second time.
const raceBuild = true
