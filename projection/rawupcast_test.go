package projection_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

type memoFiledV1 struct {
	Title string `json:"title"`
}

type memoFiledV2 struct {
	Title    string `json:"title"`
	Priority string `json:"priority"`
}

// refuseTitled is the v1→v2 upcaster: it refuses memos titled "refuse", as
// an upcaster does for old data it cannot translate.
func refuseTitled(old json.RawMessage) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal(old, &m); err != nil {
		return nil, err
	}
	if m["title"] == "refuse" {
		return nil, errors.New("cannot upcast a refused memo")
	}
	m["priority"] = "normal"
	return json.Marshal(m)
}

// An event its upcaster refuses fails in a RawPayloads consumer exactly as it
// does in a typed one: the halting shard dies on it, the continuous shard
// dead-letters it, and no handler form ever sees its stored v1 JSON as if it
// were current.
func TestRawPayloadsRefusedUpcastFailsTheEvent(t *testing.T) {
	t.Parallel()
	forms := map[string]func(p *projection.Async, et projector.EventType[memoFiledV2], h projection.HandlerFunc){
		"per-event": func(p *projection.Async, et projector.EventType[memoFiledV2], h projection.HandlerFunc) {
			must(projection.OnEvent(p, et, h))
		},
		"batch": func(p *projection.Async, et projector.EventType[memoFiledV2], h projection.HandlerFunc) {
			must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
				for _, s := range b.Streams {
					for _, ev := range s.Events {
						if err := h(ctx, tx, ev); err != nil {
							return err
						}
					}
				}
				return nil
			}, et))
		},
	}
	for form, register := range forms {
		for _, mode := range []projection.ErrorMode{projection.HaltOnError, projection.SkipApplyErrors} {
			t.Run(form+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				schema := pgtest.Schema(t)
				v1 := projector.NewRegistry()
				projector.MustDefine[memoFiledV1](v1, "memo.filed")
				old, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: v1})
				if err != nil {
					t.Fatal(err)
				}
				v2 := projector.NewRegistry()
				filed := projector.MustDefine[memoFiledV2](v2, "memo.filed", projector.TypeConfig{
					SchemaVersion: 2, Upcasters: []projector.Upcaster{{From: 1, Func: refuseTitled}},
				})
				store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: v2})
				if err != nil {
					t.Fatal(err)
				}
				seen := pgx.Identifier{schema, "seen"}.Sanitize()
				if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+seen+` (event_id uuid PRIMARY KEY, schema_version int NOT NULL, data jsonb NOT NULL)`); err != nil {
					t.Fatal(err)
				}

				var ids []projector.Event
				for i, title := range []string{"first", "refuse", "last"} {
					err := pgx.BeginFunc(ctx, old.Pool(), func(tx pgx.Tx) error {
						res, err := old.Append(ctx, tx, projector.Stream("memo", fmt.Sprint(i)), projector.NoStream, memoFiledV1{Title: title})
						ids = append(ids, res.Events...)
						return err
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				refused := ids[1]

				p := projection.NewAsync("raw", projection.AsyncConfig{RawPayloads: true, ErrorMode: mode, MaxAttempts: 1, BatchSize: 10})
				register(p, filed, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
					_, err := tx.Exec(ctx, `INSERT INTO `+seen+` VALUES ($1, $2, $3)`, ev.ID, ev.SchemaVersion, string(ev.Data))
					return err
				})
				d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p},
					PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond, Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				if err := d.Start(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					if err := d.Stop(sctx); err != nil {
						t.Errorf("stop: %v", err)
					}
				})
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				catchUp := d.CatchUp(cctx)

				applied := map[string]int{}
				rows, err := store.Pool().Query(ctx, `SELECT event_id::text, schema_version FROM `+seen)
				if err != nil {
					t.Fatal(err)
				}
				var id string
				var sv int
				if _, err := pgx.ForEachRow(rows, []any{&id, &sv}, func() error { applied[id] = sv; return nil }); err != nil {
					t.Fatal(err)
				}
				if sv, ok := applied[refused.ID.String()]; ok {
					t.Fatalf("the refused event reached the handler as schema version %d", sv)
				}
				if applied[ids[0].ID.String()] != 2 {
					t.Fatalf("the event before the refused one was not applied at v2: %v", applied)
				}

				st, err := projection.NewAdmin(store).Status(ctx, projection.ShardID{Consumer: "raw"})
				if err != nil {
					t.Fatal(err)
				}
				if mode == projection.HaltOnError {
					if catchUp == nil || st.Status != projection.StatusDead || st.FailedEventID != refused.ID || !strings.Contains(st.LastError, "upcast") {
						t.Fatalf("halting shard after a refused upcast: catch up %v, state %+v; want dead on %s", catchUp, st, refused.ID)
					}
					return
				}
				if catchUp != nil {
					t.Fatal(catchUp)
				}
				if applied[ids[2].ID.String()] != 2 {
					t.Fatalf("the continuous shard did not go on past the refused event: %v", applied)
				}
				var reason, errText string
				if err := store.Pool().QueryRow(ctx, `SELECT reason, error FROM `+store.Table("projector_dead_letters")+` WHERE event_id = $1`, refused.ID).Scan(&reason, &errText); err != nil || reason != "apply-error" || !strings.Contains(errText, "upcast") {
					t.Fatalf("dead letter of the refused event: %q %q %v", reason, errText, err)
				}
			})
		}
	}
}
