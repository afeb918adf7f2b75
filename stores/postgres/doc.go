// Package postgres is Projector's event store on PostgreSQL (pgx/v5): the
// schema and its migrations, appends inside the caller's transaction, stream
// reads, the gap-safe read of the global log, tenant-scoped transactions and
// retention. Everything else in Projector reads and writes events through a
// [Store].
//
// # Setting up
//
// Migrate the schema, then open a store on it with the same schema name:
//
//	pool, err := pgxpool.New(ctx, os.Getenv("PROJECTOR_DATABASE_URL"))
//	if err != nil { ... }
//	if _, err := postgres.Migrate(ctx, pool, "projector"); err != nil { ... }
//	store, err := postgres.New(ctx, pool, postgres.Config{Schema: "projector", Registry: reg})
//
// [Migrate] is safe to run from every instance at start-up: it applies what
// is pending in one transaction under an advisory lock keyed on the schema.
// [New] refuses a schema with pending migrations ([ErrSchemaOutdated]) rather
// than fail later on a missing column, and a database restored into another
// cluster ([ErrRestoredDatabase]), whose transaction ids would hide new
// events behind old cursors. An empty Config.Schema means [DefaultSchema] in
// both.
//
// # Appending
//
// [Store.Append] takes the caller's pgx.Tx, so the events, the inline
// projections' writes and the caller's own rows commit together or not at
// all (promise 1). It checks the expected version and returns a
// *projector.ConcurrencyError on a mismatch; an unknown or invalid payload
// writes nothing; in both cases the transaction stays usable. A transaction
// may not append to a stream whose last event a younger transaction wrote
// (the same retryable concurrency error), so that version order and the
// log's transaction order agree (promise 4).
//
// # Reading the log without skipping
//
// [Store.ReadLog] is the read every consumer uses. Sequence values are taken
// at insert and become visible at commit, in another order, so `WHERE seq >
// last` can pass an event a slower transaction commits later. Every row
// records its writing transaction; a cursor is a (transaction id, sequence)
// pair, and a read returns only events of transactions older than the oldest
// one still running (the horizon). [LogBatch.Next] moves a cursor as far as
// is safe — up to the horizon even when a filter matched nothing — and
// [LogBatch.Full] says more may follow at once:
//
//	cursor := projector.Start
//	for {
//		batch, err := store.ReadLog(ctx, postgres.LogQuery{After: cursor})
//		if err != nil { ... }
//		// ... handle batch.Events ...
//		cursor = batch.Next(cursor)
//		if !batch.Full {
//			break // caught up for now: wait, then read again from cursor
//		}
//	}
//
// A long-running transaction therefore delays delivery; it never loses an
// event (promise 3).
//
// # Errors
//
// Driver errors are turned into Projector's here and nowhere else: no rows
// become projector.ErrNotFound, a unique violation on a stream version a
// *projector.ConcurrencyError, a lock that could not be had without waiting
// [ErrLocked].
//
// # Tenancy and retention
//
// [Store.ScopeTx] and [Store.InTenantTx] scope a transaction to a tenant;
// with Config.TenantRole set, PostgreSQL's row-level security enforces it
// (docs/tenancy.md). [Store.Prune] deletes old events of ephemeral stream
// types, never ones an enabled consumer has not passed (promise 9).
package postgres
