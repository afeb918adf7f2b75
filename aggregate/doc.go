// Package aggregate loads event-sourced aggregates from the store and writes
// to them safely under concurrency: fold a stream into a typed state, load it
// as of a version or a point in time, fetch it for writing inside your
// transaction with the version checked at append (optimistic) or the stream
// locked (exclusive), run whole commands with bounded retries, and keep
// snapshots so long streams load fast. See docs/aggregates.md for a guide.
//
// # Defining an aggregate
//
// The state is a plain Go type; how each event changes it is a fold per event
// type, written against the typed payload and registered with the handle
// [projector.Define] returned:
//
//	tickets, err := aggregate.New(store, aggregate.Config[Ticket]{
//		Name: "ticket",
//		Folds: []aggregate.Fold[Ticket]{
//			aggregate.On(opened, func(t *Ticket, e TicketOpened) { t.Subject, t.Open = e.Subject, true }),
//			aggregate.On(closed, func(t *Ticket, e TicketClosed) { t.Open = false }),
//		},
//	})
//
// Folds rather than an Apply method with a type switch: a fold cannot name
// an event type that was never defined or take the wrong payload type (both
// are compile errors or errors from [New] at start-up), there is no default
// case to forget, and the state type stays free of framework methods, which
// keeps it a plain value that encodes to JSON for snapshots.
//
// A [Repository] is bound to one store, because folds are checked against
// that store's registry and snapshots live in its schema.
//
// # Reading
//
// [Repository.Load] returns the current state and version;
// [Repository.LoadVersion] and [Repository.LoadAsOf] travel back in time.
// Loads never write and never lock. A stream without events is
// [projector.ErrNotFound].
//
// # Writing
//
// Three ways, from most to least control:
//
//   - [Repository.FetchForWriting] reads the state inside your transaction;
//     [Writer.Append] then appends with the version it read as the expected
//     version, so a concurrent writer makes the later one fail with
//     [projector.ErrConcurrency]. [Writer.AssertVersion] holds the version
//     until commit for a transaction that decides on the state but does not
//     append.
//   - [Repository.FetchExclusive] locks the stream first (also one that does
//     not exist yet), so concurrent writers wait instead of failing, or fail
//     at once with [ErrLocked] when asked not to wait.
//   - [Repository.Handle] runs a command: fetch, decide, append, commit, and
//     on a concurrency error retry with jittered backoff in a new transaction.
//
// # Snapshots
//
// With [Snapshots].Every set, a [Writer] stores the folded state (as JSON)
// whenever it appends at least that many events past the newest snapshot,
// in the append's transaction and behind a savepoint: a snapshot commits
// with the events it describes or not at all, and failing to write one never
// fails an append. Loads, including as-of loads, start from the newest
// snapshot at or below their target and fold only the events after it.
// [Snapshots].Version names the shape of the state; snapshots of any other
// shape are ignored, so bump it whenever the state's JSON or its folds
// change and old snapshots can never be mis-decoded.
package aggregate
