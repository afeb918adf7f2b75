package postgres

import (
	"fmt"
	"sync"
	"testing"
)

func cacheEntry(id string, wrapped byte) cachedKey {
	return cachedKey{ref: SubjectRef{Tenant: "t", ID: id}, keyID: "m1", wrapped: []byte{wrapped}, key: []byte{wrapped, wrapped}}
}

// The cache's contract, which promise 19 leans on: an entry is used only
// for the very key row it was made from (lookup), trusted only at the
// epoch a read confirmed it at (trusted, confirm), gone once dropped or
// seen forgotten, and bounded, evicting entries not used lately before
// those just used.
func TestKeyCache(t *testing.T) {
	t.Parallel()
	c := newKeyCache(3)
	a := cacheEntry("a", 1)
	c.put(a)
	if _, ok := c.lookup(a.ref, "m1", []byte{1}); !ok {
		t.Fatal("lookup of the row the entry was made from missed")
	}
	if _, ok := c.lookup(a.ref, "m1", []byte{2}); ok {
		t.Fatal("lookup of another key row hit")
	}
	if _, ok := c.lookup(a.ref, "m2", []byte{1}); ok {
		t.Fatal("lookup under another master key hit")
	}
	if _, ok := c.trusted(a.ref, 7); ok {
		t.Fatal("an entry no read confirmed is trusted")
	}
	c.confirm(a.ref, []byte{9}, 7) // another row's bytes: not this entry
	if _, ok := c.trusted(a.ref, 7); ok {
		t.Fatal("confirmed by another key row's bytes")
	}
	c.confirm(a.ref, []byte{1}, 7)
	if e, ok := c.trusted(a.ref, 7); !ok || e.epoch != 7 || string(e.key) != "\x01\x01" {
		t.Fatalf("trusted at the confirmed epoch: %+v, %v", e, ok)
	}
	if _, ok := c.trusted(a.ref, 8); ok {
		t.Fatal("trusted at an epoch it was not confirmed at")
	}
	// A new key row for the subject replaces the entry, untrusted.
	c.put(cacheEntry("a", 2))
	if _, ok := c.trusted(a.ref, 7); ok {
		t.Fatal("a replaced entry keeps the old one's trust")
	}
	if _, ok := c.lookup(a.ref, "m1", []byte{1}); ok {
		t.Fatal("the replaced entry's row still hits")
	}
	c.drop(a.ref)
	if _, ok := c.get(a.ref); ok {
		t.Fatal("a dropped entry is still there")
	}

	// Forgotten: the key goes, and the subject is known forgotten at
	// that epoch only, until a key is put again.
	b := cacheEntry("b", 3)
	c.put(b)
	c.sawForgotten(b.ref, 5)
	if _, ok := c.get(b.ref); ok {
		t.Fatal("a key seen forgotten is still cached")
	}
	if !c.forgottenAt(b.ref, 5) || c.forgottenAt(b.ref, 6) {
		t.Fatal("forgotten is not remembered at exactly its epoch")
	}
	c.put(b)
	if c.forgottenAt(b.ref, 5) {
		t.Fatal("a subject whose key was put again is still taken as forgotten")
	}
	c.drop(b.ref)

	// Bounded: full, a put evicts an entry not used since the last
	// sweep before those used.
	for _, id := range []string{"x", "y", "z"} {
		c.put(cacheEntry(id, 4))
	}
	c.get(SubjectRef{Tenant: "t", ID: "x"})
	c.get(SubjectRef{Tenant: "t", ID: "z"})
	c.put(cacheEntry("w", 4)) // sweeps the bits, then evicts the first unused
	c.get(SubjectRef{Tenant: "t", ID: "w"})
	c.get(SubjectRef{Tenant: "t", ID: "x"})
	c.put(cacheEntry("v", 4))
	var held []string
	for _, id := range []string{"v", "w", "x", "y", "z"} {
		if _, ok := c.get(SubjectRef{Tenant: "t", ID: id}); ok {
			held = append(held, id)
		}
	}
	if len(held) != 3 {
		t.Fatalf("holds %v; want 3 entries", held)
	}
	if fmt.Sprint(held) != "[v w x]" {
		t.Fatalf("holds %v; want v (just put) and w and x (used since the last sweep)", held)
	}
}

// Readers in several goroutines and a writer at once, under -race: every
// hit is the entry put for that subject.
func TestKeyCacheConcurrent(t *testing.T) {
	t.Parallel()
	c := newKeyCache(16)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				id := fmt.Sprint((i + g) % 40)
				ref := SubjectRef{Tenant: "t", ID: id}
				switch i % 5 {
				case 0:
					c.put(cachedKey{ref: ref, keyID: "m1", wrapped: []byte(id), key: []byte(id)})
				case 1:
					c.confirm(ref, []byte(id), int64(i))
				case 2:
					if i%3 == 0 {
						c.drop(ref)
					}
				default:
					if e, ok := c.get(ref); ok && (e.ref != ref || string(e.key) != id) {
						t.Errorf("got %+v for %s", e, id)
						return
					}
					c.trusted(ref, int64(i))
				}
			}
		}()
	}
	wg.Wait()
	n := len(c.entries)
	for k, el := range c.entries {
		if el.Value.(cachedKey).ref != k {
			t.Errorf("entry %v holds %v's key", k, el.Value.(cachedKey).ref)
		}
	}
	if n > 16 || n != c.order.Len() {
		t.Fatalf("%d entries, %d in the recency list; want the same, at most 16", n, c.order.Len())
	}
}

// BenchmarkKeyCacheTrusted is a warm read's per-event cache work: is the
// subject's key trusted at the read's epoch (100 subjects, all cached).
// parallel runs it from every core at once, as a process's concurrent
// reads do.
func BenchmarkKeyCacheTrusted(b *testing.B) {
	c := newKeyCache(DefaultKeyCacheSize)
	refs := make([]SubjectRef, 100)
	for i := range refs {
		refs[i] = SubjectRef{Tenant: "acme", ID: fmt.Sprintf("c-%d", i)}
		c.put(cachedKey{ref: refs[i], keyID: "m1", wrapped: []byte{byte(i)}, key: []byte{1}})
		c.confirm(refs[i], []byte{byte(i)}, 3)
	}
	b.Run("serial", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if _, ok := c.trusted(refs[i%100], 3); !ok {
				b.Fatal("not trusted")
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, ok := c.trusted(refs[i%100], 3); !ok {
					b.Error("not trusted")
					return
				}
				i++
			}
		})
	})
}
