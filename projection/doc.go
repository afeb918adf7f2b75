// Package projection keeps read models up to date from the event log:
// inline projections inside the append's transaction, async projections
// through the dispatcher daemon.
//
// # Defining a projection
//
// A projection has a stable name and typed handlers registered once at
// start-up:
//
//	workload := projection.NewAsync("agent_workload", projection.AsyncConfig{})
//	err := projection.On(workload, ticketAssigned, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e TicketAssigned) error {
//		_, err := tx.Exec(ctx, `INSERT INTO workload ...`, e.Agent)
//		return err
//	})
//	if err != nil {
//		return err
//	}
//
// ticketAssigned is the handle projector.Define returned for the payload type
// TicketAssigned.
//
// [OnBatch] registers one handler for whole batches instead, for set-based
// writes. Registering a handler for an undefined event type, or the same
// type twice, is an error at registration and again at start.
//
// # Delivery
//
// Each async projection is a consumer with one or more shards, each a row in
// projector_consumers holding a cursor into the log. A [Shared] consumer has
// one shard that any number of dispatchers compete for: a pass tries the
// shard's transaction-scoped advisory lock, so exactly one process applies a
// given batch and the others skip it without waiting (promise 6). An
// advisory lock rather than SELECT … FOR UPDATE SKIP LOCKED on the row,
// because a row lock gives the pass a transaction id at once, and a running
// transaction with an id holds back delivery cluster-wide: a slow read-only
// handler would stall every other consumer. A
// [PerInstance] consumer has a shard per dispatcher instance id: every
// process applies every event.
//
// # Heartbeats and stale instances
//
// Each dispatcher records its instance in projector_instances when it
// starts and refreshes the row every [Config.HeartbeatEvery], riding on the
// loop that probes the log head. [Admin.List] uses it to tell a shard a live
// dispatcher holds from an unattended one ([ShardState.Dispatcher]), and
// [Admin.Remove] to refuse removing a consumer something runs. A
// per-instance shard whose instance has not been seen for
// [Config.InstanceExpiry] is stale: a process that died without a graceful
// stop must not hold retention back forever, so the store's Prune passes it,
// removing it if its instance id was random (no process can resume it) and
// halting it, with the reason, if a fixed id's unapplied events are deleted,
// so the instance does not resume over the gap unknowingly when it returns.
//
// # Ordering and exactly-once effects
//
// A pass reads with the store's gap-safe log read, so the cursor never passes
// an event a running transaction will commit later (promise 3), and a
// stream's events arrive in version order (promise 4). The handlers' writes
// and the cursor advance commit in the same transaction: a crash anywhere
// replays work that rolled back, never work that committed (promise 5).
// Events a handler appends through the transaction it is given are committed
// with the cursor too, so an emitted event exists exactly once; its
// causation id is the handled event's id and its correlation id carries on.
//
// Effects outside PostgreSQL — sending mail, indexing, publishing — cannot
// join the transaction. They happen at least once: a batch that fails or
// crashes after the effect is applied again. Make them idempotent with the
// event id (ev.ID), which is stable across replays.
//
// # Slow handlers
//
// A pass that has written holds back delivery of later events for every
// consumer until it commits (promise 3 cuts both ways). Keep handlers quick;
// each batch has a deadline, AsyncConfig.BatchTimeout, past which it fails
// and is retried like any error.
//
// # Errors
//
// In the default [HaltOnError] mode a failing event is retried with
// exponential backoff; events before it in the batch are committed, nothing
// after it is applied. After MaxAttempts failures of the same event the
// shard is dead: it stays stopped until an operator restarts, skips or
// disables it ([Admin]); other consumers carry on (promise 7). In
// [SkipApplyErrors] (continuous) mode the failing event's effects are rolled
// back to a savepoint, the event is written to projector_dead_letters and the
// batch goes on. A panicking handler fails like an erroring one.
//
// A systemic failure ([IsSystemic]: a missing table, column or grant, a lost
// connection, a server shutting down) is not about the event it struck: every
// event behind it would fail alike, and in continuous mode the dead-letter
// table would bury the cause. So in either mode the shard goes dead at once,
// nothing is dead-lettered, and the error says it is systemic; an operator
// fixes the cause and restarts the consumer.
//
// # Tenancy
//
// Each handler runs in the transaction scoped to its event's tenant
// (postgres.Store.ScopeTx): row-level-security policies hold, enforced by
// PostgreSQL (promise 8). System-tenant events run unscoped.
//
// # Wake-ups
//
// A caught-up dispatcher polls the log head adaptively (every PollMin, 2ms
// by default, while events arrive, backing off to PollMax while none do;
// appends through the dispatcher's own Store wake it in memory) rather than using
// LISTEN/NOTIFY, whose commit-time lock cost 40% of append throughput with 16
// writers in our measurements; see docs/performance.md.
package projection
