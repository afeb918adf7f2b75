package projector_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinksResolve checks every relative link of README.md, CHANGELOG.md
// and docs/*.md: the file it names exists and the anchor after its '#', if
// any, is a heading of that file, as GitHub derives anchors from headings.
// The docs link into one another by section (scaling.md's figures live in
// performance.md), and a heading renamed or moved broke such links
// silently.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	pages := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, docs...)
	anchors := map[string]map[string]bool{}
	texts := map[string]string{}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		texts[p] = string(b)
		anchors[filepath.Clean(p)] = headingAnchors(string(b))
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, p := range pages {
		for i, line := range proseLines(texts[p]) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, frag, _ := strings.Cut(target, "#")
				dest := filepath.Clean(p)
				if file != "" {
					dest = filepath.Clean(filepath.Join(filepath.Dir(p), file))
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %s: no file %s", p, i+1, target, dest)
						continue
					}
				}
				if frag == "" {
					continue
				}
				known, ok := anchors[dest]
				if !ok {
					if b, err := os.ReadFile(dest); err == nil && strings.HasSuffix(dest, ".md") {
						known = headingAnchors(string(b))
						anchors[dest] = known
					}
				}
				if known != nil && !known[frag] {
					t.Errorf("%s:%d: link %s: %s has no heading whose anchor is #%s", p, i+1, target, dest, frag)
				}
			}
		}
	}
	if checked < 100 {
		t.Errorf("checked %d links; the pages hold hundreds: is the link pattern still right?", checked)
	}
}

// proseLines returns text's lines with those of fenced code blocks blanked
// (a link's syntax inside code is not a link), so indexes stay line numbers.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives text's headings:
// lowercased, everything but letters, digits, '_', '-' and spaces dropped,
// spaces turned to '-', a repeated anchor suffixed -1, -2….
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		trimmed := strings.TrimLeft(l, "#")
		if len(trimmed) == len(l) || !strings.HasPrefix(trimmed, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(trimmed)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n, dup := seen[a]; dup {
			seen[a] = n + 1
			a += "-" + strconv.Itoa(n+1)
		} else {
			seen[a] = 0
		}
		out[a] = true
	}
	return out
}
