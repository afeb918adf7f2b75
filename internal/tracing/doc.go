// Package tracing holds what Projector's packages share for OpenTelemetry:
// the names of the spans and attributes they record, and how a span
// context travels inside an event's metadata headers.
//
// # Why the context lives in the event
//
// An event is handled long after, and often far from, the request that
// appended it: in another process, after a restart. The only thing that
// travels that far is the event row, so the appending span's context is
// written into the event's headers as a W3C traceparent (and tracestate),
// and every hop that handles the event reads it back from there. The W3C
// format is fixed here rather than taken from the application's global
// propagator: stored events outlive any one process's configuration.
//
// # Why only the API
//
// Projector is a library: it records spans through the OpenTelemetry API
// and a TracerProvider it is given (the global one by default). Which SDK,
// sampler and exporter run is the application's choice; without one every
// call here is a no-op.
package tracing
