package projection_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// Names no shard can have are refused before they reach PostgreSQL: an
// operator's typo with a NUL or invalid UTF-8 is "not found", not a raw
// driver error quoting its bytes, and a dispatcher refuses an instance id it
// could not store.
func TestShardNamesCheckedBeforePostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	admin := projection.NewAdmin(e.store)
	for _, id := range []projection.ShardID{{Consumer: "a\x00b"}, {Consumer: "bad\xff"}, {Consumer: "ok", Instance: "i\x00"}} {
		if _, err := admin.Status(e.ctx, id); !errors.Is(err, projector.ErrNotFound) || carriesRawBytes(err) {
			t.Errorf("status %q: %v, want a clean ErrNotFound", id, err)
		}
		if err := admin.Restart(e.ctx, id); !errors.Is(err, projector.ErrNotFound) || carriesRawBytes(err) {
			t.Errorf("restart %q: %v, want a clean ErrNotFound", id, err)
		}
		if _, err := admin.Remove(e.ctx, id.Consumer, id.Instance); !errors.Is(err, projector.ErrNotFound) {
			t.Errorf("remove %q: %v, want ErrNotFound", id, err)
		}
	}
	p := counting(e.schema, e.types, "named", projection.AsyncConfig{})
	for _, instance := range []string{"pod\x00", "pod\xff", strings.Repeat("p", projector.MaxNameLength+1), projection.RebuildInstance, projection.SharedInstance} {
		if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, InstanceID: instance}); err == nil {
			t.Errorf("instance id %q accepted", instance)
		}
	}
}

// carriesRawBytes reports an error message with a NUL or invalid UTF-8 in
// it: bytes of a bad name quoted raw instead of escaped.
func carriesRawBytes(err error) bool {
	return strings.IndexByte(err.Error(), 0) >= 0 || !utf8.ValidString(err.Error())
}
