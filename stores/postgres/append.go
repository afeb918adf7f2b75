package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// AppendResult is what an append wrote.
type AppendResult struct {
	// Events are the stored events in version order, payloads included.
	Events []projector.Event
	// Version is the stream's version after the append.
	Version int64
}

// Position is the global-log position of the append's last event, what
// [projection.WaitFor] waits for; [projector.Start] when nothing was
// appended. Every event of one append shares its transaction, so a consumer
// past this position has passed all of them.
//
// [projection.WaitFor]: https://pkg.go.dev/github.com/projectorhq/projector/projection#WaitFor
func (r AppendResult) Position() projector.Position {
	if len(r.Events) == 0 {
		return projector.Start
	}
	return r.Events[len(r.Events)-1].Position
}

// Append appends payloads, in order, to stream inside the caller's
// transaction, after checking expected against the stream's version. Each
// payload's Go type must have been defined in the store's registry; payloads
// implementing [projector.Validator] are validated. Metadata (correlation,
// causation, actor, headers) comes from ctx; without a correlation id the
// append starts a new one.
//
// Nothing is written, and nothing is sent to PostgreSQL, when a payload is
// unknown or invalid ([projector.ErrUnknownEventType],
// [projector.ErrInvalidPayload]), when the stream reference or the metadata
// hold what PostgreSQL cannot store exactly (NUL bytes, invalid UTF-8, names
// over [projector.MaxNameLength] bytes: [projector.ErrInvalidStream],
// [projector.ErrInvalidPayload]; see [projector.StreamRef.Validate] and
// [projector.Metadata.Validate]); nothing is written either when the version
// check fails (a [*projector.ConcurrencyError]). In all these cases the
// transaction stays usable. A concurrency error is also returned when this
// transaction is older than the one that last appended to the stream: retry
// in a new transaction. When an inline projection fails after the events were
// written, the transaction is aborted, so neither the events, the read
// models, nor the caller's own writes can commit.
//
// All events of one append go out in a single statement.
//
// When ctx carries a sampled or recording span, the append runs in a span
// of its own (inline projections included) and each event records that
// span's context in its headers (traceparent, tracestate), which is how
// the handlers it reaches continue the trace; without one, no span is
// started and nothing is recorded (docs/tracing.md).
func (s *Store) Append(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, expected projector.ExpectedVersion, payloads ...any) (AppendResult, error) {
	if err := stream.Validate(); err != nil {
		// Its error names the stream: "append to stream X: … stream X: …"
		// said it twice.
		return AppendResult{}, fmt.Errorf("append: %w", err)
	}
	if tracing.Recorded(trace.SpanFromContext(ctx)) {
		return s.appendTraced(ctx, tx, stream, expected, payloads)
	}
	res, err := s.appendEvents(ctx, tx, stream, expected, payloads, false)
	if err != nil {
		return AppendResult{}, fmt.Errorf("append to stream %s: %w", stream, err)
	}
	return res, nil
}

// appendEvents writes the events; traced writes the span context of ctx
// into their headers. Personal fields are sealed under keys from the
// process's cache when it has them, guarded by the insert itself; when the
// guard fails (a cached key was forgotten, or never committed), nothing
// was written and the append runs again without the cache.
func (s *Store) appendEvents(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, expected projector.ExpectedVersion, payloads []any, traced bool) (AppendResult, error) {
	res, err := s.appendOnce(ctx, tx, stream, expected, payloads, traced, true)
	if errors.Is(err, errStaleKey) {
		return s.appendOnce(ctx, tx, stream, expected, payloads, traced, false)
	}
	return res, err
}

// appendOnce is appendEvents, with or without the key cache.
func (s *Store) appendOnce(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, expected projector.ExpectedVersion, payloads []any, traced, cached bool) (AppendResult, error) {
	if tx == nil {
		return AppendResult{}, errors.New("nil transaction: append runs inside the caller's transaction")
	}
	// The stream was validated by Append, appendOnce's only way in.
	if expected < projector.AnyVersion {
		return AppendResult{}, fmt.Errorf("%w: expected version %d (want AnyVersion, NoStream or ExactVersion(n≥0))", projector.ErrInvalidStream, int64(expected))
	}
	if len(payloads) == 0 {
		return AppendResult{}, fmt.Errorf("%w: no events to append", projector.ErrInvalidPayload)
	}
	md := projector.MetadataFrom(ctx)
	if traced {
		md.Headers = tracing.Inject(ctx, md.Headers)
	}
	if err := md.Validate(); err != nil {
		return AppendResult{}, err
	}

	n := len(payloads)
	events := make([]projector.Event, n)
	// [16]byte rather than uuid.UUID: pgx encodes it natively, where a
	// uuid.UUID goes through driver.Valuer and a failed plan per element.
	ids := make([][16]byte, n)
	newIDs(ids)
	types := make([]string, n)
	versions := make([]int32, n)
	// The stored payloads, one after another in one buffer: datas[i] is
	// payload i's slice of it, as a string without a copy of its own.
	datas := make([]string, n)
	ends := make([]int, n)
	var stored strings.Builder
	if md.CorrelationID == uuid.Nil {
		md.CorrelationID = newID()
	}
	var keys *sealing // the subjects' keys, when a payload has personal fields
	// The event envelopes kept apart (Personal.EnvelopeApart), one per
	// event, nil for the events without one; nil when none has.
	var envelopes [][]byte
	for i, p := range payloads {
		enc, err := s.registry.Encode(p)
		if err != nil {
			return AppendResult{}, fmt.Errorf("event %d: %w", i, err)
		}
		data := enc.Data
		forgotten := false
		if s.registry.HasPersonal() {
			// Sealed in Go before the insert: the events table never sees
			// a personal field in the clear (docs/privacy.md).
			if keys == nil {
				keys = s.newSealing(cached)
			}
			var env []byte
			if data, env, forgotten, err = s.seal(ctx, tx, stream.Tenant, enc, keys, true); err != nil {
				return AppendResult{}, fmt.Errorf("event %d: %w", i, err)
			}
			if env != nil {
				if envelopes == nil {
					envelopes = make([][]byte, n)
				}
				envelopes[i] = env
			}
		}
		if i == 0 {
			stored.Grow(n * (len(data) + 8))
		}
		stored.Write(data)
		ends[i] = stored.Len()
		types[i] = enc.Type
		versions[i] = int32(enc.SchemaVersion)
		events[i] = projector.Event{
			ID: ids[i], Stream: stream, Type: enc.Type, SchemaVersion: enc.SchemaVersion,
			Data: enc.Data, Payload: deref(p), Metadata: md,
		}
		if forgotten {
			// The subject was forgotten and a personal field held a value:
			// the inline projections (and the caller) get the event as
			// every read returns it, opened without a key (fields null,
			// marked Forgotten), not the values the log never held.
			view, _, err := projector.OpenWith(data, "", nil)
			if err != nil {
				return AppendResult{}, fmt.Errorf("event %d: %w", i, err)
			}
			payload, _, err := s.registry.Decode(enc.Type, enc.SchemaVersion, view)
			if err != nil {
				return AppendResult{}, fmt.Errorf("event %d: %w", i, err)
			}
			events[i].Data, events[i].Payload, events[i].Forgotten = view, payload, true
		}
	}
	all := stored.String()
	for i, start := 0, 0; i < n; i++ {
		datas[i], start = all[start:ends[i]], ends[i]
	}
	if err := s.checkInline(ctx, types); err != nil {
		return AppendResult{}, err
	}
	var causation *uuidParam
	if md.CausationID != uuid.Nil {
		c := uuidParam(md.CausationID)
		causation = &c
	}
	// The headers' JSON as a string (or NULL): a []byte would be sent as
	// bytea text in the query modes that do not learn the column's type
	// (see uuidParam), which jsonb refuses.
	var headers *string
	if len(md.Headers) > 0 {
		b, err := json.Marshal(md.Headers)
		if err != nil {
			return AppendResult{}, fmt.Errorf("%w: headers: %w", projector.ErrInvalidPayload, err)
		}
		h := string(b)
		headers = &h
	}

	guard := guardNone
	if keys != nil && len(keys.guardSubjects) > 0 {
		guard = guardMany
		if len(keys.guardSubjects) == 1 {
			guard = guardOne
		}
	}
	envelope := appendPlain
	if envelopes != nil {
		envelope = appendEnvelope
	}
	sql, takesVersion := s.sql.append.statement(expected, n, guard, envelope)
	args := make([]any, 0, 15)
	args = append(args, stream.Tenant, stream.Type, stream.ID, int64(n))
	if n == 1 {
		// Scalars: the one-event statement inserts a row of parameters,
		// which also spares encoding four one-element arrays.
		args = append(args, uuidParam(ids[0]), types[0], versions[0], datas[0])
	} else {
		args = append(args, uuidArray(ids), textArray(types), versions, datas)
	}
	args = append(args, uuidParam(md.CorrelationID), causation, md.Actor, headers)
	if takesVersion {
		args = append(args, int64(expected))
	}
	switch guard {
	case guardMany:
		args = append(args, keys.guardSubjects, keys.guardWrapped)
	case guardOne:
		args = append(args, keys.guardSubjects[0], keys.guardWrapped[0])
	}
	if envelopes != nil {
		if n == 1 {
			args = append(args, envelopes[0])
		} else {
			args = append(args, envelopes)
		}
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return AppendResult{}, mapError(stream, expected, err)
	}
	got, err := scanInserted(rows, n)
	if err != nil {
		return AppendResult{}, mapError(stream, expected, err)
	}
	if len(got) == 0 {
		if guard != guardNone {
			if err := s.checkGuard(ctx, tx, stream.Tenant, keys); err != nil {
				return AppendResult{}, err
			}
		}
		return AppendResult{}, s.refusal(ctx, tx, stream, expected)
	}
	if len(got) != n {
		return AppendResult{}, s.abort(ctx, tx, fmt.Errorf("inserted %d of %d events", len(got), n))
	}
	// RETURNING order is not guaranteed; versions are contiguous from the
	// lowest, and payload i got version lowest+i.
	lowest := got[0].version
	for _, g := range got {
		lowest = min(lowest, g.version)
	}
	for _, g := range got {
		i := g.version - lowest
		if i < 0 || i >= int64(n) {
			return AppendResult{}, s.abort(ctx, tx, fmt.Errorf("insert returned non-contiguous versions"))
		}
		events[i].Version, events[i].Position, events[i].RecordedAt = g.version, g.pos, g.at
	}
	for _, p := range s.inline {
		if err := p.ApplyInline(ctx, tx, events); err != nil {
			return AppendResult{}, s.abort(ctx, tx, fmt.Errorf("inline projection %q: %w", p.Name(), err))
		}
	}
	s.appended(events[0].Position.TxID)
	return AppendResult{Events: events, Version: events[n-1].Version}, nil
}

// refusal reads the stream head to say why the head upsert matched nothing.
func (s *Store) refusal(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, expected projector.ExpectedVersion) error {
	var version int64
	var last uint64
	var mine *uint64
	var archived bool
	err := tx.QueryRow(ctx, s.sql.streamHead, stream.Tenant, stream.Type, stream.ID).Scan(&version, &last, &mine, &archived)
	if errors.Is(err, pgx.ErrNoRows) {
		return &projector.ConcurrencyError{Stream: stream, Expected: expected, Actual: 0, Reason: "stream does not exist"}
	}
	if err != nil {
		return &projector.ConcurrencyError{Stream: stream, Expected: expected, Actual: -1, Reason: "reading the stream head failed: " + err.Error()}
	}
	if archived {
		return archivedError(stream)
	}
	ce := &projector.ConcurrencyError{Stream: stream, Expected: expected, Actual: version}
	if (expected == projector.AnyVersion || int64(expected) == version) && mine != nil && last > *mine {
		ce.Reason = fmt.Sprintf("transaction %d is older than transaction %d, which appended to the stream after it started writing; retry in a new transaction", *mine, last)
	}
	return ce
}

// abort puts the transaction into the failed state, so a caller who ignores
// the returned error still cannot commit half an append: COMMIT on an
// aborted transaction rolls back.
func (s *Store) abort(ctx context.Context, tx pgx.Tx, cause error) error {
	_, _ = tx.Exec(context.WithoutCancel(ctx), abortSQL)
	return cause
}

// abortSQL raises an error inside the transaction: the one portable way to
// mark a transaction as failed from the client without ending it.
const abortSQL = `DO $$BEGIN RAISE EXCEPTION 'projector: append failed after writing; the transaction is aborted and must be rolled back'; END$$`

// mapError turns driver errors into Projector's: serialization failures,
// deadlocks and a version that another writer inserted first are all the
// retryable concurrency error.
func mapError(stream projector.StreamRef, expected projector.ExpectedVersion, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "23505":
			return concurrencyFrom(&projector.ConcurrencyError{Stream: stream, Expected: expected, Actual: -1, Reason: pgErr.Message}, pgErr)
		}
	}
	return err
}

// concurrencyFrom is ce caused by PostgreSQL's pgErr: it reads as ce with
// the SQLSTATE after it, and unwraps to both, so a caller that retries a
// transaction which lost a conflict (a deadlock's victim, a serialization
// failure: the dispatcher, a partial rebuild) tells it from a version
// another writer took, which is not a conflict of the moment.
func concurrencyFrom(ce *projector.ConcurrencyError, pgErr *pgconn.PgError) error {
	return &causedConcurrency{msg: fmt.Errorf("%w (%s)", ce, pgErr.Code), cause: pgErr}
}

type causedConcurrency struct {
	msg   error
	cause *pgconn.PgError
}

func (e *causedConcurrency) Error() string   { return e.msg.Error() }
func (e *causedConcurrency) Unwrap() []error { return []error{e.msg, e.cause} }

// newID returns a time-ordered UUID (version 7), which keeps the event-id
// index append-mostly.
func newID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.New()
	}
	return id
}

// deref returns the value a payload pointer points at, so handlers always
// receive values whatever the caller appended.
func deref(p any) any {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer {
		return p
	}
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	return v.Interface()
}
