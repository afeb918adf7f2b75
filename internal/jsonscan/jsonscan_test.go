package jsonscan

import "testing"

// stringEndBytewise is StringEnd as it was before it searched with
// bytes.IndexByte: one byte at a time. The fast one must agree with it on
// every input.
func stringEndBytewise(data []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, false
}

func TestStringEnd(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in      string
		end     int
		escaped bool
	}{
		{`""`, 2, false},
		{`"abc",`, 5, false},
		{`"pjx2.AAAA-_"}`, 13, false},
		{`"a\"b"`, 6, true},
		{`"a\\"b"`, 5, true},
		{`"a\\\"b"`, 8, true},
		{`"\u00e9"`, 8, true},
		{`"abc\"`, -1, false},
		{`"abc`, -1, false},
		{`"`, -1, false},
		{`"abc\`, -1, false},
		{`"a\"b\"c" "d"`, 9, true},
	} {
		end, escaped := StringEnd([]byte(c.in), 0)
		if end != c.end || (end >= 0 && escaped != c.escaped) {
			t.Errorf("StringEnd(%q) = %d, %v; want %d, %v", c.in, end, escaped, c.end, c.escaped)
		}
	}
}

// FuzzStringEnd holds StringEnd to the byte-at-a-time loop it replaced,
// from every starting offset.
func FuzzStringEnd(f *testing.F) {
	for _, s := range []string{`""`, `"a\"b"`, `{"name":"pjx2.AbC-_","email":"pjx2."}`, `"\\\\"`, `"abc\`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for i := range len(data) + 1 {
			gotEnd, gotEsc := StringEnd(data, i)
			wantEnd, wantEsc := stringEndBytewise(data, i)
			if gotEnd != wantEnd || gotEsc != wantEsc {
				t.Fatalf("StringEnd(%q, %d) = %d, %v; the byte loop gives %d, %v", data, i, gotEnd, gotEsc, wantEnd, wantEsc)
			}
		}
	})
}
