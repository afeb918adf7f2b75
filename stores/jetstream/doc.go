// Package jetstream relays Projector's event log to a NATS JetStream stream
// and applies it, on the other side, to PostgreSQL with exactly-once
// effects. docs/jetstream.md is the guide.
//
// # The relay
//
// A [Relay] is an async consumer (projection.Async) whose batch handler
// publishes every event of a batch asynchronously on subject
// <prefix>.<tenant>.<stream type>.<event type> ([Subject]; tokens escaped
// with [EscapeToken]) and returns only after every acknowledgement arrived:
// the dispatcher commits the cursor after JetStream stored the batch, never
// before. A failure fails the whole batch, which the dispatcher retries from
// the cursor with backoff — message-by-message retries could reorder a
// stream. The event id is the Nats-Msg-Id, so what a retry or a crash
// republishes is dropped by the stream's duplicate window; [Relay.Ensure]
// refuses a stream whose window, subjects or storage do not fit. Beyond the
// window (a relay down longer than it between publish and cursor commit),
// the relay reads back the stream's messages past its committed cursor
// after a start or a failed publish and does not publish those events
// again ([MaxTailWalk]). The events table is the outbox: appends never
// touch NATS.
//
// # The message
//
// The body is the payload JSON; the envelope is in headers ([NewMsg]).
// [Decode] turns a message back into a projector.Event through a registry,
// upcasters included.
//
// # The claims consumer
//
// A [Consumer] runs each message's handler in a transaction that first
// claims (subscription, event id) and checks the source stream's last
// handled version, so a redelivery of committed work is skipped and an
// event whose predecessor is missing is held (nak with delay) rather than
// applied out of order ([Gaps] shows a stream waiting for a missing
// version, [SkipTo] moves past it, never past a held event). Handler
// errors are retried with backoff and dead-lettered after MaxDeliver
// failures of the handler (holds and redeliveries do not count). JetStream deduplicates
// publishes only; effects need the claims. [PurgeClaims] deletes claims
// older than a [ClaimsRetention] that outlasts the duplicate window and
// the redelivery time; [ListDeadLetters] (the open ones),
// [ListDeadLettersMatching] (by status, paged), [GetDeadLetter], [DiscardDeadLetter]
// and [Consumer.RetryDeadLetter] are what the `relay dead-letters` commands
// run. A dead letter is kept after a retry resolves it or a discard gives
// it up, as the record; only open ones can be retried or discarded
// ([ErrDeadLetterNotOpen]). Operators see the open ones in the gauge
// projector_jetstream_dead_letters_open{subscription}
// ([ConsumerConfig.Registerer]) and in `projector relay status`
// ([CountOpenDeadLettersInDatabase]).
//
// Under [ParkStream] ([ConsumerConfig.ErrorMode]) a failure after
// MaxDeliver parks the event's source stream instead: it and the stream's
// later messages are stored in order, never reaching the handler, until
// [Consumer.RetryPark] applies the sequence or [DiscardPark] gives it up
// (`relay parked`; [ListParks], [GetPark], [CountParkedStreamsInDatabase],
// the gauge projector_jetstream_parked_streams{subscription}).
package jetstream
