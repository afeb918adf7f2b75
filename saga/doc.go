// Package saga runs sagas (process managers) on the dispatcher: workflows
// that react to events from many streams, keep a typed state per
// correlation key, append events, and wait for deadlines ("escalate a
// ticket nobody answered within its SLA").
//
// # Defining a saga
//
// A saga type has a stable name, a state type S and handlers:
//
//	sla := saga.New[SLAState]("ticket_sla", saga.Config{})
//	err := saga.StartOn(sla, ticketOpened, saga.ByStream, func(ctx context.Context, in *saga.Instance[SLAState], ev projector.Event, e TicketOpened) error {
//		in.State.Priority = e.Priority
//		in.After("escalate", 4*time.Hour)
//		return nil
//	})
//
// [StartOn] registers an event type that may start an instance, [On] one
// that only reaches an existing instance, [OnTimeout] a timeout's handler.
// Each takes a [KeyFunc] that finds the instance (the ticket id, the order
// id). A handler decides: it changes in.State and records appends
// ([Instance.Append]), aggregate commands ([Command]), timeouts
// ([Instance.After], [Instance.Schedule], [Instance.Cancel]) and completion
// ([Instance.Complete]). It writes nothing itself, so it can be tested
// without a database (package sagatest) and the saga can apply its
// decisions exactly once.
//
// # Exactly once
//
// [Saga.Projection] returns the async projection that runs the saga on a
// dispatcher. The steps of a dispatcher batch run inside the batch's
// transaction: the instances the batch names are row-locked and read in one
// statement (SELECT … FOR UPDATE, in id order), each event's step is decided
// in log order on the state the previous one left, the appends are made,
// and the timeouts, new states and a row per step in projector_saga_steps
// are written in one round trip, committing with the consumer's cursor
// (promise 5). A failing event fails its batch, which the dispatcher
// bisects until the event is alone, so the steps before it commit. A crash anywhere rolls the step
// back with the cursor, so it is taken again, never twice. Appended events
// carry the handled event's id as causation and the instance's correlation
// id (that of the event that started it).
//
// # Timeouts
//
// Timeouts are rows in projector_saga_timeouts with a due time (indexed).
// A [Runner], started beside the dispatcher, claims the earliest due ones
// with their instances (FOR UPDATE … SKIP LOCKED) and, for each under a
// savepoint, runs its handler, applies the step and deletes the timeout, all
// committing together: a timeout fires once,
// at or after its due time by the saga's clock ([Config.Now], injectable),
// never before, and a crash leaves it pending. The instance's row lock
// serialises a timeout's step with an event's step for the same instance,
// in whichever process each runs. A due timeout whose instance is locked
// is passed over until the next look. The runner sleeps until the earliest
// pending timeout is due, at most [RunnerConfig.Poll] (the dispatcher's
// slowest poll), so it never scans and never polls faster than the
// dispatcher.
//
// # Completion, late and duplicate events
//
// A completed instance keeps its row (for `projector saga show`) until
// [PruneCompleted] deletes it; its pending timeouts are cancelled when it
// completes, and events that still reach it are ignored and counted
// (late_events, [Saga.Late]). An event that maps to no instance and may not
// start one is ignored and counted ([Saga.Ignored]). Two start events for
// one key give one instance: the instance's (saga, tenant, key) is unique,
// the insert does nothing on conflict and the second event finds the first
// instance.
//
// # Errors
//
// A handler's error, or a decision that cannot be carried out (an empty
// key, a timeout in the past, an appended payload of an undefined type:
// [ErrInvalidStep]), fails the step and nothing of it is written. An event's
// failing step halts the saga's consumer like a failing projection's
// (retried with backoff, dead after MaxAttempts, `projector consumer`
// restarts or skips it). In continuous mode (Config.Async.ErrorMode
// projection.SkipApplyErrors) it is rolled back instead, the event
// dead-lettered and the instance marked failed, and the consumer goes on;
// contention and database failures are retried in both modes, since
// dead-lettering them would skip events that a later try takes. A
// timeout's failing step is retried with backoff; after
// [Config.TimeoutAttempts] the instance is marked failed.
//
// # Operating
//
// `projector run` runs the sagas an application hands it through
// cli.Wiring.Sagas, with a [Runner] for their timeouts whose metrics
// ([RunnerConfig.Registerer]) count fired timeouts, their lateness, and
// ignored, late and dead-lettered events. `projector events prune` deletes
// completed instances past its --saga-retention, as [PruneCompleted] does.
//
// Contention is not failure: when an event's step and a timeout's step
// append to the same stream, the older transaction is refused (promise 4)
// and retried — the runner at once, the consumer after
// [DefaultRetryBackoff].
package saga
