package postgres_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// checkHarmlessMessage fails when an error message carries what it must
// not: raw NUL or invalid bytes, or a whole oversized value.
func checkHarmlessMessage(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if !utf8.ValidString(msg) || strings.ContainsRune(msg, 0) || len(msg) > 1000 {
		t.Errorf("error message echoes raw input (%d bytes): %q", len(msg), msg[:min(len(msg), 300)])
	}
}

// Strings PostgreSQL cannot store (NUL bytes, invalid UTF-8, names too long
// for the stream index) are refused at the API boundary with a typed error,
// before anything is sent: the caller's transaction stays usable and nothing
// is written. Invalid UTF-8 in a payload or header is refused rather than
// silently rewritten to U+FFFD by encoding/json.
func TestAppendRefusesStringsPostgresCannotStore(t *testing.T) {
	t.Parallel()
	f := setup(t)
	long := strings.Repeat("x", 10_000)
	ok := projector.TenantStream("acme", "ticket", "t-1")
	opened := testevents.TicketOpened{Title: "fine"}
	cases := []struct {
		name     string
		stream   projector.StreamRef
		ctx      func(context.Context) context.Context
		payloads []any
		want     error
	}{
		{name: "NUL in tenant", stream: projector.TenantStream("ac\x00me", "ticket", "1"), want: projector.ErrInvalidStream},
		{name: "invalid UTF-8 in tenant", stream: projector.TenantStream("ac\xffme", "ticket", "1"), want: projector.ErrInvalidStream},
		{name: "NUL in stream type", stream: projector.Stream("tick\x00et", "1"), want: projector.ErrInvalidStream},
		{name: "invalid UTF-8 in stream type", stream: projector.Stream("tick\xc3et", "1"), want: projector.ErrInvalidStream},
		{name: "NUL in stream id", stream: projector.Stream("ticket", "t\x00-1"), want: projector.ErrInvalidStream},
		{name: "invalid UTF-8 in stream id", stream: projector.Stream("ticket", "t-\xed\xa0\x80"), want: projector.ErrInvalidStream},
		{name: "10000-byte stream id", stream: projector.Stream("ticket", long), want: projector.ErrInvalidStream},
		{name: "10000-byte stream type", stream: projector.Stream(long, "1"), want: projector.ErrInvalidStream},
		{name: "10000-byte tenant", stream: projector.TenantStream(long, "ticket", "1"), want: projector.ErrInvalidStream},
		{name: "NUL in actor", ctx: func(c context.Context) context.Context { return projector.WithActor(c, "agent\x007") }, want: projector.ErrInvalidPayload},
		{name: "invalid UTF-8 in actor", ctx: func(c context.Context) context.Context { return projector.WithActor(c, "agent\xff") }, want: projector.ErrInvalidPayload},
		{name: "NUL in header value", ctx: func(c context.Context) context.Context { return projector.WithHeader(c, "trace", "a\x00b") }, want: projector.ErrInvalidPayload},
		{name: "NUL in header name", ctx: func(c context.Context) context.Context { return projector.WithHeader(c, "tr\x00ace", "ab") }, want: projector.ErrInvalidPayload},
		{name: "invalid UTF-8 in header value", ctx: func(c context.Context) context.Context { return projector.WithHeader(c, "trace", "a\xffb") }, want: projector.ErrInvalidPayload},
		{name: "invalid UTF-8 in header name", ctx: func(c context.Context) context.Context { return projector.WithHeader(c, "tr\xfface", "ab") }, want: projector.ErrInvalidPayload},
		{name: "metadata over MaxMetadataBytes", ctx: func(c context.Context) context.Context {
			return projector.WithHeader(c, "blob", strings.Repeat("b", projector.MaxMetadataBytes))
		}, want: projector.ErrInvalidPayload},
		{name: "NUL in payload string", payloads: []any{testevents.TicketOpened{Title: "printer\x00on fire"}}, want: projector.ErrInvalidPayload},
		{name: "invalid UTF-8 in payload string", payloads: []any{testevents.TicketOpened{Title: "printer \xff on fire"}}, want: projector.ErrInvalidPayload},
		{name: "invalid UTF-8 in a later payload", payloads: []any{opened, testevents.TicketCommented{Body: "\xfe"}}, want: projector.ErrInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := f.ctx
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			stream := tc.stream
			if stream == (projector.StreamRef{}) {
				stream = ok
			}
			payloads := tc.payloads
			if payloads == nil {
				payloads = []any{opened}
			}
			tx, err := f.store.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = f.store.Append(ctx, tx, stream, projector.AnyVersion, payloads...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("append: %v, want %v", err, tc.want)
			}
			checkHarmlessMessage(t, err)
			// The caller's transaction is still usable and commits.
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
				t.Fatalf("the caller's transaction is unusable after the refusal: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("commit after the refusal: %v", err)
			}
			var n int
			if err := f.store.Pool().QueryRow(f.ctx, `SELECT (SELECT count(*) FROM `+f.store.Table("projector_events")+`) + (SELECT count(*) FROM `+f.store.Table("projector_streams")+`)`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("a refused append wrote %d rows (%v)", n, err)
			}
		})
	}
}

// What is storable goes in unchanged: the longest allowed names, a genuine
// U+FFFD, text that merely looks like an escape, non-ASCII everywhere.
func TestAppendKeepsStorableStringsExactly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	name := strings.Repeat("é", projector.MaxNameLength/2) // 254 bytes
	s := projector.TenantStream(name, name, name)
	ctx := projector.WithActor(projector.WithHeader(f.ctx, "trace\ufffd", "v\ufffd"), "agent \ufffd ✓")
	title := "replacement \ufffd, text \\u0000 and \\ufffd, tab\tand emoji 🎫"
	err := pgx.BeginFunc(ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: title})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Payload.(testevents.TicketOpened).Title != title || evs[0].Stream != s ||
		evs[0].Metadata.Actor != "agent \ufffd ✓" || evs[0].Metadata.Headers["trace\ufffd"] != "v\ufffd" {
		t.Fatalf("read back %+v", evs)
	}
}

// Reads refuse the same strings before sending them, inside the caller's
// transaction too, which stays usable.
func TestReadsRefuseStringsPostgresCannotStore(t *testing.T) {
	t.Parallel()
	f := setup(t)
	bad := projector.Stream("ticket", "t\x00-1")
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(f.ctx) }()
	_, streamErr := f.store.ReadStreamTx(f.ctx, tx, bad, postgres.StreamQuery{})
	_, versionErr := f.store.StreamVersion(f.ctx, tx, bad)
	_, eventTypeErr := f.store.ReadLogTx(f.ctx, tx, postgres.LogQuery{EventTypes: []string{"ticket.opened", "a\x00b"}})
	_, streamTypeErr := f.store.ReadLogTx(f.ctx, tx, postgres.LogQuery{StreamTypes: []string{"tick\xffet"}})
	// Longer than any stored name: refused as the CLI refuses it, not sent
	// to match nothing (an API audit), and out-of-range sizes with a sentinel.
	long := strings.Repeat("t", 100_000)
	_, longTypeErr := f.store.ReadLogTx(f.ctx, tx, postgres.LogQuery{EventTypes: []string{long}})
	_, longExportErr := f.store.Export(f.ctx, io.Discard, postgres.ExportOptions{StreamTypes: []string{long}})
	_, limitErr := f.store.ReadLogTx(f.ctx, tx, postgres.LogQuery{Limit: -1})
	_, pageErr := f.store.Export(f.ctx, io.Discard, postgres.ExportOptions{PageSize: -1})
	_, batchErr := f.store.Import(f.ctx, strings.NewReader(""), postgres.ImportOptions{BatchSize: -1})
	_, retireErr := postgres.RetireInlineProjection(f.ctx, tx, f.store.Schema(), "a\xffb")
	checks := []struct {
		name      string
		err, want error
	}{
		{"ReadStreamTx", streamErr, projector.ErrInvalidStream},
		{"StreamVersion", versionErr, projector.ErrInvalidStream},
		{"ReadLogTx event types", eventTypeErr, projector.ErrInvalidEventType},
		{"ReadLogTx stream types", streamTypeErr, projector.ErrInvalidStream},
		{"ReadLogTx a 100 kB event type", longTypeErr, projector.ErrInvalidEventType},
		{"Export a 100 kB stream type", longExportErr, projector.ErrInvalidStream},
		{"ReadLogTx a negative limit", limitErr, postgres.ErrInvalidConfig},
		{"Export a negative page size", pageErr, postgres.ErrInvalidConfig},
		{"Import a negative batch size", batchErr, postgres.ErrInvalidConfig},
		{"RetireInlineProjection a name not UTF-8", retireErr, postgres.ErrInvalidConfig},
	}
	for _, c := range checks {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
			continue
		}
		checkHarmlessMessage(t, c.err)
	}
	if _, err := tx.Exec(f.ctx, `SELECT 1`); err != nil {
		t.Fatalf("the caller's transaction is unusable after refused reads: %v", err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
}
