package projector_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/projectorhq/projector"
)

func TestStreamRefValidate(t *testing.T) {
	t.Parallel()
	atLimit := strings.Repeat("n", projector.MaxNameLength)
	cases := []struct {
		name    string
		ref     projector.StreamRef
		wantErr error
	}{
		{"plain", projector.TenantStream("acme", "ticket", "t-1"), nil},
		{"system tenant", projector.Stream("ticket", "t-1"), nil},
		{"names at the limit", projector.TenantStream(atLimit, atLimit, atLimit), nil},
		{"non-ASCII, spaces, control characters", projector.TenantStream("Zürich AG", "ticket", "line\nbreak\t✓"), nil},
		{"no tenant", projector.TenantStream("", "ticket", "1"), projector.ErrInvalidStream},
		{"no type", projector.Stream("", "1"), projector.ErrInvalidStream},
		{"no id", projector.Stream("ticket", ""), projector.ErrInvalidStream},
		{"NUL in tenant", projector.TenantStream("a\x00", "ticket", "1"), projector.ErrInvalidStream},
		{"NUL in type", projector.Stream("\x00", "1"), projector.ErrInvalidStream},
		{"NUL in id", projector.Stream("ticket", "1\x00"), projector.ErrInvalidStream},
		{"invalid UTF-8 in tenant", projector.TenantStream("\xff", "ticket", "1"), projector.ErrInvalidStream},
		{"invalid UTF-8 in type", projector.Stream("tick\xc3", "1"), projector.ErrInvalidStream},
		{"surrogate bytes in id", projector.Stream("ticket", "\xed\xa0\x80"), projector.ErrInvalidStream},
		{"tenant over the limit", projector.TenantStream(atLimit+"n", "ticket", "1"), projector.ErrInvalidStream},
		{"type over the limit", projector.Stream(atLimit+"n", "1"), projector.ErrInvalidStream},
		{"id over the limit", projector.Stream("ticket", strings.Repeat("é", 128)), projector.ErrInvalidStream},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.ref.Validate()
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				checkMessage(t, err.Error())
			}
		})
	}
}

func TestMetadataValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		md      projector.Metadata
		wantErr error
	}{
		{"empty", projector.Metadata{}, nil},
		{"plain", projector.Metadata{Actor: "agent-7", Headers: map[string]string{"trace": "abc", "": "", "ü": "\ufffd"}}, nil},
		{"long actor", projector.Metadata{Actor: strings.Repeat("a", 10_000)}, nil},
		{"actor and headers at the limit", projector.Metadata{Actor: strings.Repeat("a", projector.MaxMetadataBytes-6), Headers: map[string]string{"k": "vvvvv"}}, nil},
		{"actor over the limit", projector.Metadata{Actor: strings.Repeat("a", projector.MaxMetadataBytes+1)}, projector.ErrInvalidPayload},
		{"headers over the limit together", projector.Metadata{Actor: "x", Headers: map[string]string{
			"a": strings.Repeat("v", projector.MaxMetadataBytes/2), "b": strings.Repeat("v", projector.MaxMetadataBytes/2)}}, projector.ErrInvalidPayload},
		{"NUL in actor", projector.Metadata{Actor: "a\x00"}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in actor", projector.Metadata{Actor: "\xff"}, projector.ErrInvalidPayload},
		{"NUL in header name", projector.Metadata{Headers: map[string]string{"\x00": "v"}}, projector.ErrInvalidPayload},
		{"NUL in header value", projector.Metadata{Headers: map[string]string{"k": "v\x00"}}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in header name", projector.Metadata{Headers: map[string]string{"k\xfe": "v"}}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in header value", projector.Metadata{Headers: map[string]string{"k": "\xc0\xaf"}}, projector.ErrInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.md.Validate()
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				checkMessage(t, err.Error())
			}
		})
	}
}

// checkMessage fails when an error message carries raw bytes of the input:
// NUL, invalid UTF-8, control characters, or a long value whole.
func checkMessage(t *testing.T, msg string) {
	t.Helper()
	if !utf8.ValidString(msg) || strings.ContainsAny(msg, "\x00\n\t") || len(msg) > 500 {
		t.Fatalf("message echoes raw input: %q", msg)
	}
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"ticket-1":   "ticket-1",
		"Zürich ✓":   "Zürich ✓",
		"":           "",
		"a\x00b":     `"a\x00b"`,
		"a\xffb":     `"a\xffb"`,
		"line\nnext": `"line\nnext"`,
		strings.Repeat("x", projector.MaxNameLength): strings.Repeat("x", projector.MaxNameLength),
		strings.Repeat("x", 1000):                    `"` + strings.Repeat("x", 64) + `"…(1000 bytes)`,
		"x" + strings.Repeat("é", 200):               `"x` + strings.Repeat("é", 31) + `"…(401 bytes)`, // cut on a rune boundary
	}
	for in, want := range cases {
		if got := projector.Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
	text := map[string]string{
		"a short error":                "a short error",
		"\x1b[31mred\x1b[0m":           `"\x1b[31mred\x1b[0m"`,
		"\x1b]0;owned\a":               `"\x1b]0;owned\a"`,
		"bidi \u202e txt":              `"bidi \u202e txt"`,
		strings.Repeat("y", 100):       strings.Repeat("y", 100),
		strings.Repeat("y", 101):       `"` + strings.Repeat("y", 100) + `"…(101 bytes)`,
		strings.Repeat("\x1b", 10_000): `"` + strings.Repeat(`\x1b`, 100) + `"…(10000 bytes)`,
	}
	for in, want := range text {
		if got := projector.PrintableText(in, 100); got != want {
			t.Errorf("PrintableText(%q, 100) = %q, want %q", in, got, want)
		}
	}
	if got := projector.Stream("ticket", "a\x00").String(); got != `__system__/ticket/"a\x00"` {
		t.Errorf("String of a ref with NUL: %q", got)
	}
}

type note struct {
	Text string            `json:"text"`
	Tags map[string]string `json:"tags,omitempty"`
	Refs []*string         `json:"refs,omitempty"`
	Raw  json.RawMessage   `json:"raw,omitempty"`
	Bin  []byte            `json:"bin,omitempty"`
	Any  any               `json:"any,omitempty"`
	Skip string            `json:"-"`
	Name label             `json:"name,omitempty"`
}

// label is a TextMarshaler that hands back its bytes unchecked.
type label string

func (l label) MarshalText() ([]byte, error) { return []byte(l), nil }

func TestEncodeRefusesWhatPostgresCannotStoreExactly(t *testing.T) {
	t.Parallel()
	r := projector.NewRegistry()
	projector.MustDefine[note](r, "note.taken")
	bad := "x\xffy"
	cases := []struct {
		name    string
		payload note
		wantErr error
	}{
		{"plain", note{Text: "hello"}, nil},
		{"genuine U+FFFD", note{Text: "\ufffd", Tags: map[string]string{"\ufffd": "\ufffd"}}, nil},
		{"text that looks like escapes", note{Text: `\u0000 \ufffd \ud800 \\u0000`}, nil},
		{"escaped U+FFFD in raw JSON", note{Raw: json.RawMessage(`"\ufffd"`)}, nil},
		{"surrogate pair in raw JSON", note{Raw: json.RawMessage(`"\ud83d\ude00"`)}, nil},
		{"invalid bytes in []byte (base64)", note{Bin: []byte{0xff, 0}}, nil},
		{"invalid UTF-8 in a skipped field", note{Text: "ok", Skip: bad, Raw: json.RawMessage(`"\ufffd"`)}, nil},
		{"invalid UTF-8", note{Text: bad}, projector.ErrInvalidPayload},
		{"invalid UTF-8 beside an escaped U+FFFD", note{Text: bad, Raw: json.RawMessage(`"\ufffd"`)}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in a map key", note{Tags: map[string]string{bad: "v"}}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in a map value", note{Tags: map[string]string{"k": bad}}, projector.ErrInvalidPayload},
		{"invalid UTF-8 behind a pointer", note{Refs: []*string{nil, &bad}}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in an interface", note{Any: []any{1, bad}}, projector.ErrInvalidPayload},
		{"invalid UTF-8 from a TextMarshaler", note{Name: label(bad)}, projector.ErrInvalidPayload},
		{"NUL", note{Text: "a\x00b"}, projector.ErrInvalidPayload},
		{"NUL in a map key", note{Tags: map[string]string{"\x00": ""}}, projector.ErrInvalidPayload},
		{"NUL in raw JSON", note{Raw: json.RawMessage(`{"a":"\u0000"}`)}, projector.ErrInvalidPayload},
		{"invalid UTF-8 in raw JSON", note{Raw: json.RawMessage("\"\xff\"")}, projector.ErrInvalidPayload},
		{"lone high surrogate in raw JSON", note{Raw: json.RawMessage(`"\ud800x"`)}, projector.ErrInvalidPayload},
		{"lone low surrogate in raw JSON", note{Raw: json.RawMessage(`"\udc00"`)}, projector.ErrInvalidPayload},
		{"high surrogate at the end of raw JSON", note{Raw: json.RawMessage(`"\ud800"`)}, projector.ErrInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			enc, err := r.Encode(tc.payload)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				checkMessage(t, err.Error())
				return
			}
			var back note
			if err := json.Unmarshal(enc.Data, &back); err != nil {
				t.Fatal(err)
			}
			if back.Text != tc.payload.Text {
				t.Fatalf("text changed on the way: %q became %q", tc.payload.Text, back.Text)
			}
		})
	}
}

// checkStorable fails unless s is what PostgreSQL text stores exactly.
func checkStorable(t *testing.T, what, s string) {
	t.Helper()
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		t.Fatalf("accepted %s %q, which PostgreSQL cannot store", what, s)
	}
}

// FuzzStreamRefValidate: Validate never panics; what it accepts is
// non-empty, valid UTF-8, NUL-free and within MaxNameLength in every part;
// what it refuses matches ErrInvalidStream with a message that carries no raw
// bytes; String never carries raw bytes either.
func FuzzStreamRefValidate(f *testing.F) {
	f.Add("acme", "ticket", "t-1")
	f.Add(projector.SystemTenant, "ticket", "a\x00b")
	f.Add("\xff", "tick\xc3et", "\xed\xa0\x80")
	f.Add("", "ticket", "1")
	f.Add("Zürich", strings.Repeat("x", 300), "line\nbreak")
	f.Fuzz(func(t *testing.T, tenant, typ, id string) {
		ref := projector.TenantStream(tenant, typ, id)
		if s := ref.String(); !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 || len(s) > 3*(projector.MaxNameLength+2)+2 {
			t.Fatalf("String echoes raw input: %q", s)
		}
		err := ref.Validate()
		if err != nil {
			if !errors.Is(err, projector.ErrInvalidStream) {
				t.Fatalf("error %v does not match ErrInvalidStream", err)
			}
			if msg := err.Error(); !utf8.ValidString(msg) || strings.ContainsAny(msg, "\x00\n") || len(msg) > 1200 {
				t.Fatalf("message echoes raw input: %q", msg)
			}
			return
		}
		for _, part := range []string{tenant, typ, id} {
			if part == "" || len(part) > projector.MaxNameLength {
				t.Fatalf("accepted %q with a part of %d bytes", ref, len(part))
			}
			checkStorable(t, "stream part", part)
		}
	})
}

// FuzzMetadataValidate: Validate never panics; accepted metadata is valid
// UTF-8 and NUL-free throughout and encodes to JSON without any change;
// refused metadata matches ErrInvalidPayload with a harmless message.
func FuzzMetadataValidate(f *testing.F) {
	f.Add("agent-7", "trace", "abc")
	f.Add("a\x00", "k", "v")
	f.Add("", "k\xff", "v")
	f.Add("", "k", "\ufffd\xfe")
	f.Fuzz(func(t *testing.T, actor, key, value string) {
		md := projector.Metadata{Actor: actor, Headers: map[string]string{key: value}}
		err := md.Validate()
		if err != nil {
			if !errors.Is(err, projector.ErrInvalidPayload) {
				t.Fatalf("error %v does not match ErrInvalidPayload", err)
			}
			if msg := err.Error(); !utf8.ValidString(msg) || strings.ContainsAny(msg, "\x00\n") || len(msg) > 1000 {
				t.Fatalf("message echoes raw input: %q", msg)
			}
			return
		}
		checkStorable(t, "actor", actor)
		checkStorable(t, "header name", key)
		checkStorable(t, "header value", value)
		data, err := json.Marshal(md.Headers)
		if err != nil {
			t.Fatal(err)
		}
		var back map[string]string
		if err := json.Unmarshal(data, &back); err != nil || back[key] != value || len(back) != 1 {
			t.Fatalf("headers changed on the way: %q → %q (%v)", md.Headers, back, err)
		}
	})
}

// FuzzEncodeStorable: Encode never panics; what it accepts is valid UTF-8
// JSON with no NUL in any string, and a string payload comes back exactly;
// what it refuses matches ErrInvalidPayload.
func FuzzEncodeStorable(f *testing.F) {
	f.Add("hello", []byte(`{"a":1}`))
	f.Add("a\xffb", []byte(`"\ufffd"`))
	f.Add("\ufffd", []byte(`"\u0000"`))
	f.Add(`\u0000`, []byte(`"\ud800"`))
	f.Add("", []byte("\"\xff\""))
	r := projector.NewRegistry()
	projector.MustDefine[note](r, "note.taken")
	f.Fuzz(func(t *testing.T, text string, raw []byte) {
		p := note{Text: text}
		if json.Valid(raw) {
			p.Raw = raw
		}
		enc, err := r.Encode(p)
		if err != nil {
			if !errors.Is(err, projector.ErrInvalidPayload) {
				t.Fatalf("error %v does not match ErrInvalidPayload", err)
			}
			return
		}
		if !utf8.Valid(enc.Data) {
			t.Fatalf("accepted invalid UTF-8 JSON %q", enc.Data)
		}
		var back note
		if err := json.Unmarshal(enc.Data, &back); err != nil {
			t.Fatal(err)
		}
		if back.Text != text {
			t.Fatalf("text changed on the way: %q became %q", text, back.Text)
		}
		checkStorable(t, "text", back.Text)
		var tree any
		if err := json.Unmarshal(enc.Data, &tree); err != nil {
			t.Fatal(err)
		}
		if s := strings.Join(stringsIn(tree, nil), ""); strings.IndexByte(s, 0) >= 0 {
			t.Fatalf("accepted a NUL in %q", enc.Data)
		}
	})
}

// stringsIn collects every string (keys too) of a decoded JSON value.
func stringsIn(v any, out []string) []string {
	switch v := v.(type) {
	case string:
		out = append(out, v)
	case []any:
		for _, e := range v {
			out = stringsIn(e, out)
		}
	case map[string]any:
		for k, e := range v {
			out = stringsIn(e, append(out, k))
		}
	}
	return out
}
