package search_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/projectorhq/projector/search"
)

// applyOps is the documented meaning of each operation on an in-memory
// index (tenant\x00id → document), for checking Compact.
func applyOps(docs map[string]map[string]string, ops []search.Op) {
	for _, op := range ops {
		k := op.Tenant + "\x00" + op.ID
		switch op.Kind {
		case search.OpUpsert:
			d := map[string]string{}
			for a, v := range op.Doc {
				d[a] = string(v)
			}
			docs[k] = d
		case search.OpPatch:
			d := docs[k]
			if d == nil {
				d = map[string]string{}
				docs[k] = d
			}
			for a, v := range op.Doc {
				d[a] = string(v)
			}
		case search.OpDelete:
			delete(docs, k)
		case search.OpDeleteWhere:
			want := string(must1(op.Filters[0].JSON()))
			maps.DeleteFunc(docs, func(key string, d map[string]string) bool {
				return key[:len(op.Tenant)+1] == op.Tenant+"\x00" && d[op.Filters[0].Attr] == want
			})
		}
	}
}

func must1[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCompactKeepsTheResult: random operation sequences give the same
// index compacted as applied one by one, and compacted they have at most
// three runs of one kind between delete-wheres.
func TestCompactKeepsTheResult(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 2000 {
		var ops []search.Op
		for range 1 + rng.IntN(30) {
			op := search.Op{Tenant: []string{"a", "b"}[rng.IntN(2)], ID: fmt.Sprint(rng.IntN(5))}
			field := func() map[string]json.RawMessage {
				return map[string]json.RawMessage{"id": json.RawMessage(`"` + op.ID + `"`), []string{"x", "y", "c"}[rng.IntN(3)]: json.RawMessage(fmt.Sprint(rng.IntN(3)))}
			}
			switch r := rng.IntN(10); {
			case r < 4:
				op.Kind, op.Doc = search.OpUpsert, field()
			case r < 7:
				op.Kind, op.Doc = search.OpPatch, field()
			case r < 9:
				op.Kind = search.OpDelete
			default:
				op.Kind, op.ID, op.Filters = search.OpDeleteWhere, "", []search.Filter{search.Eq("c", rng.IntN(3))}
			}
			ops = append(ops, op)
		}
		naive, compacted := map[string]map[string]string{}, map[string]map[string]string{}
		applyOps(naive, ops)
		c := search.Compact(ops)
		applyOps(compacted, c)
		if !maps.EqualFunc(naive, compacted, maps.Equal) {
			t.Fatalf("round %d: ops %+v\ncompacted %+v\none by one: %v\ncompacted: %v", round, ops, c, naive, compacted)
		}
		runs := 0
		for i := range c {
			if c[i].Kind == search.OpDeleteWhere {
				runs = 0
				continue
			}
			if i == 0 || c[i-1].Kind != c[i].Kind {
				runs++
			}
			if runs > 3 {
				t.Fatalf("round %d: more than three runs between delete-wheres: %+v", round, c)
			}
		}
	}
}
