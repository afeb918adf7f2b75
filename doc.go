// Package projector is the shared vocabulary of Projector, a projection and
// read-model engine for event-sourced Go applications on PostgreSQL.
//
// It holds what every other package speaks: the [Event] envelope and its
// [Metadata], stream references and expected versions, log [Position]s, the
// event-type [Registry] with schema versions and upcasters, and the sentinel
// errors callers test with [errors.Is]. It imports nothing of Projector's own,
// so the store, aggregates, projections and sagas can all depend on it without
// depending on each other.
//
// # Event types
//
// Every event type is defined once, at start-up, with [Define]:
//
//	reg := projector.NewRegistry()
//	ticketOpened := projector.MustDefine[TicketOpened](reg, "ticket.opened")
//
// The store refuses to append a payload whose Go type was never defined, and
// validates payloads that implement [Validator] before anything is written.
//
// # Metadata from the context
//
// Correlation id, causation id, actor and headers travel in the
// [context.Context] (see [WithCorrelationID], [WithActor], [WithHeader]), so
// a request handler sets them once and every append made on its behalf
// carries them. An append whose context has no correlation id starts a new
// correlation.
package projector
