package projector_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
)

type opened struct {
	Title string `json:"title"`
}

func (o opened) Validate() error {
	if o.Title == "" {
		return errors.New("title is required")
	}
	return nil
}

type closed struct{ Reason string }

type ptrValidated struct{ N int }

func (p *ptrValidated) Validate() error {
	if p.N < 0 {
		return errors.New("negative")
	}
	return nil
}

func TestDefine(t *testing.T) {
	t.Parallel()
	okUp := []projector.Upcaster{{From: 1, Func: func(b json.RawMessage) (json.RawMessage, error) { return b, nil }}}
	cases := []struct {
		name    string
		define  func(r *projector.Registry) error
		wantErr error
	}{
		{"plain", func(r *projector.Registry) error { _, err := projector.Define[opened](r, "ticket.opened"); return err }, nil},
		{"three parts", func(r *projector.Registry) error {
			_, err := projector.Define[opened](r, "billing.invoice.paid")
			return err
		}, nil},
		{"no area", func(r *projector.Registry) error { _, err := projector.Define[opened](r, "opened"); return err }, projector.ErrInvalidEventType},
		{"name over MaxNameLength", func(r *projector.Registry) error {
			_, err := projector.Define[opened](r, "ticket."+strings.Repeat("a", projector.MaxNameLength))
			return err
		}, projector.ErrInvalidEventType},
		{"upper case", func(r *projector.Registry) error { _, err := projector.Define[opened](r, "Ticket.Opened"); return err }, projector.ErrInvalidEventType},
		{"pointer payload", func(r *projector.Registry) error { _, err := projector.Define[*opened](r, "ticket.opened"); return err }, projector.ErrInvalidEventType},
		{"interface payload", func(r *projector.Registry) error { _, err := projector.Define[any](r, "ticket.opened"); return err }, projector.ErrInvalidEventType},
		{"same name twice", func(r *projector.Registry) error {
			projector.MustDefine[opened](r, "ticket.opened")
			_, err := projector.Define[closed](r, "ticket.opened")
			return err
		}, projector.ErrDuplicateEventType},
		{"same type twice", func(r *projector.Registry) error {
			projector.MustDefine[opened](r, "ticket.opened")
			_, err := projector.Define[opened](r, "ticket.reopened")
			return err
		}, projector.ErrDuplicateEventType},
		{"version without upcaster", func(r *projector.Registry) error {
			_, err := projector.Define[opened](r, "ticket.opened", projector.TypeConfig{SchemaVersion: 2})
			return err
		}, projector.ErrInvalidEventType},
		{"version with upcaster", func(r *projector.Registry) error {
			_, err := projector.Define[opened](r, "ticket.opened", projector.TypeConfig{SchemaVersion: 2, Upcasters: okUp})
			return err
		}, nil},
		{"upcaster out of range", func(r *projector.Registry) error {
			_, err := projector.Define[opened](r, "ticket.opened", projector.TypeConfig{Upcasters: okUp})
			return err
		}, projector.ErrInvalidEventType},
		{"two configs", func(r *projector.Registry) error {
			_, err := projector.Define[opened](r, "ticket.opened", projector.TypeConfig{}, projector.TypeConfig{})
			return err
		}, projector.ErrInvalidEventType},
		{"nil registry", func(*projector.Registry) error { _, err := projector.Define[opened](nil, "ticket.opened"); return err }, projector.ErrInvalidEventType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.define(projector.NewRegistry())
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestEncode(t *testing.T) {
	t.Parallel()
	r := projector.NewRegistry()
	et := projector.MustDefine[opened](r, "ticket.opened")
	projector.MustDefine[ptrValidated](r, "thing.counted")
	cases := []struct {
		name    string
		payload any
		wantErr error
	}{
		{"value", opened{Title: "x"}, nil},
		{"pointer", &opened{Title: "x"}, nil},
		{"invalid", opened{}, projector.ErrInvalidPayload},
		{"pointer-receiver validator", ptrValidated{N: -1}, projector.ErrInvalidPayload},
		{"undefined", closed{}, projector.ErrUnknownEventType},
		{"nil", nil, projector.ErrInvalidPayload},
		{"nil pointer", (*opened)(nil), projector.ErrInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := r.Encode(tc.payload)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if err == nil && (enc.Type != et.Name() || enc.SchemaVersion != 1 || string(enc.Data) != `{"title":"x"}`) {
				t.Fatalf("encoded %+v", enc)
			}
		})
	}
}

func TestDecodeUpcastChain(t *testing.T) {
	t.Parallel()
	type v3 struct {
		Title string `json:"title"`
		Prio  int    `json:"prio"`
		Tags  []string
	}
	step := func(key string, val any) projector.UpcastFunc {
		return func(b json.RawMessage) (json.RawMessage, error) {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, err
			}
			m[key] = val
			return json.Marshal(m)
		}
	}
	r := projector.NewRegistry()
	projector.MustDefine[v3](r, "ticket.opened", projector.TypeConfig{SchemaVersion: 3, Upcasters: []projector.Upcaster{
		{From: 2, Func: step("Tags", []string{"legacy"})},
		{From: 1, Func: step("prio", 1)},
	}})
	got, data, err := r.Decode("ticket.opened", 1, json.RawMessage(`{"title":"old"}`))
	if err != nil {
		t.Fatal(err)
	}
	v := got.(v3)
	if v.Title != "old" || v.Prio != 1 || len(v.Tags) != 1 || v.Tags[0] != "legacy" {
		t.Fatalf("decoded %+v from %s", v, data)
	}
	if _, _, err := r.Decode("ticket.opened", 4, json.RawMessage(`{}`)); !errors.Is(err, projector.ErrInvalidPayload) {
		t.Fatalf("future version: %v", err)
	}
	if _, _, err := r.Decode("ticket.unknown", 1, json.RawMessage(`{}`)); !errors.Is(err, projector.ErrUnknownEventType) {
		t.Fatalf("unknown type: %v", err)
	}
}

// FuzzDecode: decoding stored payloads never panics, whatever the bytes and
// the stored schema version, and what decodes re-encodes.
func FuzzDecode(f *testing.F) {
	r := projector.NewRegistry()
	projector.MustDefine[opened](r, "ticket.opened", projector.TypeConfig{SchemaVersion: 2, Upcasters: []projector.Upcaster{
		{From: 1, Func: func(b json.RawMessage) (json.RawMessage, error) {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, err
			}
			return json.Marshal(m)
		}},
	}})
	f.Add([]byte(`{"title":"x"}`), 1)
	f.Add([]byte(`{"title":"x"}`), 2)
	f.Add([]byte(`null`), 2)
	f.Add([]byte(`[1,2]`), 1)
	f.Add([]byte(`{"title":`), 0)
	f.Fuzz(func(t *testing.T, data []byte, version int) {
		v, out, err := r.Decode("ticket.opened", version, data)
		if err != nil {
			if !errors.Is(err, projector.ErrInvalidPayload) {
				t.Fatalf("error %v does not match ErrInvalidPayload", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("decode returned invalid JSON %q", out)
		}
		if _, ok := v.(opened); !ok {
			t.Fatalf("decoded %T", v)
		}
	})
}

func FuzzParsePosition(f *testing.F) {
	f.Add("0/0")
	f.Add("123/456")
	f.Add("18446744073709551615/9223372036854775807")
	f.Add("/")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := projector.ParsePosition(s)
		if err != nil {
			return
		}
		q, err := projector.ParsePosition(p.String())
		if err != nil || q != p {
			t.Fatalf("round trip of %q: %v then %v (%v)", s, p, q, err)
		}
	})
}

func TestPositionOrder(t *testing.T) {
	t.Parallel()
	a := projector.Position{TxID: 5, Seq: 100}
	b := projector.Position{TxID: 6, Seq: 1}
	if !a.Less(b) || b.Less(a) || a.Less(a) {
		t.Fatal("positions order by transaction id first")
	}
	h := projector.Horizon(6)
	if !a.Less(h) || !h.Less(b) {
		t.Fatalf("horizon(6)=%v must sort after every event of tx 5 and before every event of tx 6", h)
	}
	for _, p := range []projector.Position{a, b, {TxID: 7, Seq: 0}} {
		before := p.Before()
		if !before.Less(p) {
			t.Errorf("%v.Before() = %v does not sort before it", p, before)
		}
		// Nothing sorts strictly between: the next position up is p.
		if next := (projector.Position{TxID: before.TxID, Seq: before.Seq + 1}); before.Seq != math.MaxInt64 && next != p {
			t.Errorf("%v.Before() = %v leaves room for %v in between", p, before, next)
		}
	}
	if projector.Start.Before() != projector.Start {
		t.Error("Start.Before() must stay at Start")
	}
}

// The ops CLI prints a cursor at a horizon as "txid/max"; it parses back.
func TestParsePositionMax(t *testing.T) {
	t.Parallel()
	p, err := projector.ParsePosition("9/max")
	if err != nil || p != (projector.Position{TxID: 9, Seq: math.MaxInt64}) {
		t.Fatalf("9/max: %v, %v", p, err)
	}
	for _, bad := range []string{"9/MAX", "max/1", "9/-1", "9/"} {
		if _, err := projector.ParsePosition(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// The zero Registry is an empty one: Define on it panicked on nil maps (an
// API audit), and reads of it find nothing.
func TestZeroRegistry(t *testing.T) {
	t.Parallel()
	var reg projector.Registry
	if _, ok := reg.Lookup("ticket.opened"); ok || len(reg.Names()) != 0 {
		t.Fatal("a zero registry holds types")
	}
	type opened struct{ Title string }
	et, err := projector.Define[opened](&reg, "ticket.opened")
	if err != nil {
		t.Fatal(err)
	}
	if info, ok := reg.Lookup(et.Name()); !ok || info.SchemaVersion != 1 {
		t.Fatalf("lookup after Define on a zero registry: %+v, %v", info, ok)
	}
	if _, err := reg.Encode(opened{Title: "x"}); err != nil {
		t.Fatalf("encode: %v", err)
	}
}
