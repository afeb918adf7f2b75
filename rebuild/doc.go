// Package rebuild replays a projection from the log: in place, or
// blue/green into shadow tables that replace the live ones atomically once
// they have caught up.
//
// # Requests, not calls
//
// A rebuild is a row in projector_rebuilds, and for blue/green a second
// cursor of the consumer (its shadow shard). [Request] records it; the
// dispatchers that run the projection carry it out, wherever they are, so an
// ops binary without the projection's code can trigger one and a crashed
// rebuilder is resumed from its cursor by the next dispatcher, never
// restarted from zero.
//
// # Blue/green
//
// The shadow tables are created LIKE the live ones (indexes, defaults,
// grants, row-level-security policies) in a schema of their own. Shadow
// passes put that schema first on the search_path, so handlers that write
// unqualified table names write the shadow tables; handlers that qualify
// names call projection.Table. When the shadow shard has caught up, one of
// its passes takes the live shard's lock as well, applies the last events
// and, in the same transaction, moves the live tables to an "_old" schema,
// the shadow tables into their place and the shadow cursor onto the live
// consumer: readers see the old model or the new one, never a half-built
// one, and never an older position than before (promise 11). The old tables
// stay until [DropOld].
//
// # Versions and rolling deploys
//
// A consumer records the version of the model its tables hold. A
// dispatcher runs the consumer only with that version: during a rolling
// deploy the old binaries keep the live model current while the new ones
// build the new version; after the switch the old binaries stand aside.
// Once only new binaries remain, the live model stays at the old version,
// and lags, until the rebuild switches.
//
// # Partial rebuilds
//
// [Partial] rebuilds what one tenant or one stream contributed to a live
// model, in one transaction of the caller's process (it runs the handlers):
// it holds the live shard's lock, clears the scope as the projection
// declares (AsyncConfig.ScopeColumns, ResetScope), replays the scope's
// events up to the live cursor through the events' stream index, and
// commits, so the scope is exactly where the rest of the model is.
//
// # Side effects
//
// Handlers see projection.Replaying(ctx) during a replay; handlers wrapped
// in projection.SkipOnReplay do not run; projection.Emit appends nothing.
package rebuild
