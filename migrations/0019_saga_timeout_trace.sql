-- The trace context of the saga step that scheduled a timeout (W3C
-- traceparent and tracestate), so the timeout's span, hours later and in
-- another process, links back to it. NULL when the step was not traced.
-- Adding nullable columns without a default rewrites nothing.

ALTER TABLE {{schema}}.projector_saga_timeouts
    ADD COLUMN trace_parent text,
    ADD COLUMN trace_state  text;
