package aggregate_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// An archived stream's load is exact with IncludeArchived, and fails with
// ErrStreamArchived without it rather than loading as a new stream.
func TestLoadArchivedStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	s := projector.TenantStream("acme", "ticket", "T-9")
	f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "old", Customer: "ada"})
	f.appendTx(t, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "c", N: 1}, testevents.TicketClosed{Reason: "done"})
	want, err := tickets.Load(f.ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{s}}); err != nil || res.Streams != 1 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	_, err = tickets.Load(f.ctx, s)
	if !errors.Is(err, postgres.ErrStreamArchived) {
		t.Fatalf("load of an archived stream: %v, want ErrStreamArchived", err)
	}
	// The message says how an aggregate loads it (not only the store's
	// StreamQuery option, which a Repository's caller never builds) and
	// names the command that restores this stream, once.
	msg := err.Error()
	for _, want := range []string{"aggregate.Query with Repository.LoadTx", "projector streams unarchive --stream ticket/T-9 --tenant acme"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("load of an archived stream: %q, want it to say %q", msg, want)
		}
	}
	if n := strings.Count(msg, "streams unarchive"); n != 1 {
		t.Fatalf("load of an archived stream: %q, want the unarchive command once", msg)
	}
	got, err := tickets.LoadTx(f.ctx, f.store.Pool(), s, aggregate.Query{IncludeArchived: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != want.State || got.Version != want.Version {
		t.Fatalf("archived load: %+v at %d, want %+v at %d", got.State, got.Version, want.State, want.Version)
	}
}
