// Package projectiontest specifies projections the way a reader thinks of
// them: given these events, expect these rows. A spec takes milliseconds,
// needs no dispatcher, and runs in parallel with hundreds of others
// against one database.
//
// # On PostgreSQL: Spec
//
// [New] begins a transaction and rolls it back when the test ends; events
// given to the spec are applied inside it and [Spec.ThenRows] reads the
// read-model tables inside it too. Nothing is ever committed, so specs
// running with t.Parallel() never see each other's rows and leave nothing
// behind. The one way two specs can touch is a lock: two open
// transactions writing the same key of a unique index wait for each other,
// so give parallel specs distinct stream ids (the test's name is handy).
//
// # The production apply path
//
// An async projection (or a search projection, through its Async method)
// is applied by [projection.ApplyTx], the code a dispatcher pass runs on a
// batch: payloads decoded by the registry with its upcasters, each event's
// handler scoped to its tenant, [projection.Queue]d writes streamed, batch
// handlers given events grouped by tenant and stream, a failing event's
// effects rolled back to a savepoint, [projection.Replaying] false. An
// inline projection is applied by its own ApplyInline, as an append runs
// it, one stream at a time, scoped to the stream's tenant. What the kit
// leaves out is what surrounds the apply: the events are not written to
// the log (a handler that reads projector_events will not find them), no
// cursor moves, no AfterCommit runs, and retries, dead letters and error
// modes are the dispatcher's business ([Spec.ThenFails] sees the first
// failure).
//
// # In memory: Memory
//
// A read model whose rules are a pure function of events ([Fold]) is
// specified with [NewMemory], with no database at all: the events still go
// through the registry's encoding, upcasting and decoding, so the fold
// sees what a handler would.
//
// # Time, ids, tenants
//
// Every spec has a [Clock]: the events' RecordedAt is its time, which
// moves only when the test moves it ([Clock.Advance]). The same clock can
// drive a saga fixture (sagatest.Fixture.UseClock) and the code under
// test. Config.Deterministic makes event ids a function of the test's
// package and name, the spec's number in the test and the event's number
// in the spec, and starts the clock at [Start]; Config.Tenant fixes the
// tenant of streams that name none.
package projectiontest
