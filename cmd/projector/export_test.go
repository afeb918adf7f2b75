package main

// Main is main, for the tests' TestMain: the test binary, started under the
// name "projector", is the projector binary.
var Main = main

// Run is run, for the tests that run command lines in their own process.
var Run = run
