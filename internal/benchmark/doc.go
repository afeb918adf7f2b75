// Package benchmark measures Projector against the raw-PostgreSQL baseline
// of the same work, measured in the same run on the same database, so the
// ratio between the two is what a reader compares: absolute figures move
// with the machine and its disk, the ratio much less.
//
// Three kinds of figure, each behind a Measure function that takes a
// context, a store and sizes and returns a result struct:
//
//   - [MeasureAppend]: append throughput, Projector's Store.Append against
//     one INSERT … SELECT FROM unnest of rows of the same shape into a table
//     created LIKE projector_events INCLUDING ALL (our code), and against the
//     same payloads in the cheapest gap-safe outbox table (our schema), each
//     transaction with a business row, with concurrent writers.
//   - [MeasureCatchUp]: a dispatcher catching up a backlog with a counting
//     projection (one upsert per stream), against a hand-written loop doing
//     the same work: one transaction per batch that locks a cursor row, reads
//     gap-safely, upserts and moves the cursor. Per-event handlers and the
//     batch (OnBatch + unnest) form, each against its raw twin.
//   - [MeasureRebuild]: a blue/green rebuild of the counting projection
//     (batch form by default) over a log of a million events, beside the
//     live catch-up of the same projection and the raw loop, with the
//     switch's lock time: issue 9 wants the rebuild at 1.5 times the live
//     rate or better.
//   - [MeasureLatency]: time from an append's commit to the dispatcher's
//     AfterCommit at a steady rate, against LISTEN/NOTIFY from the same
//     commit as the floor; a dispatcher on the appenders' Store (hinted in
//     memory) and one on a Store of its own (polling, as in another process).
//
// [Run] does all four in throwaway schemas ([NewSchema], dropped by
// [DropSchema] even when the context is cancelled) and is what
// `projector bench` prints. The Go benchmarks in stores/postgres and
// projection wrap the same pieces ([Appender], [CatchUp],
// [LatencySamples]), so the figures in docs/performance.md and those of the
// command come from one implementation.
//
// Everything appended uses this package's own event types ([NewRegistry]):
// a store handed to a Measure function must have been built with that
// registry, on a schema of its own, since the measurements write events,
// tables and consumer rows there. Like the test harnesses, this package
// talks to pgx directly: the raw baselines are, by definition, plain SQL.
package benchmark
