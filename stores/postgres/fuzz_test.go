package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// FuzzDecodeEnvelope: assembling an event from stored columns never panics,
// and anything it rejects is an ErrInvalidPayload.
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"title":"x"}`), []byte(`{"trace":"abc"}`), true)
	f.Add([]byte(`{}`), []byte(`null`), false)
	f.Add([]byte(`{"a":`), []byte(`{"n":1}`), true)
	f.Add([]byte(``), []byte(`[]`), true)
	f.Fuzz(func(t *testing.T, data, headers []byte, positioned bool) {
		var tx *uint64
		var seq *int64
		if positioned {
			a, b := uint64(7), int64(9)
			tx, seq = &a, &b
		}
		ev, err := postgres.DecodeEnvelope(tx, seq, uuid.New(), projector.Stream("t", "1"), 1, "ticket.opened", 1,
			data, uuid.New(), nil, "", headers, time.Now())
		if err != nil {
			if !errors.Is(err, projector.ErrInvalidPayload) {
				t.Fatalf("error %v does not match ErrInvalidPayload", err)
			}
			return
		}
		if ev.Position.TxID != 7 || string(ev.Data) != string(data) {
			t.Fatalf("decoded %+v", ev)
		}
	})
}
