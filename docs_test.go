package projector_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestDocSnippetsCompile compiles every ```go block of README.md and
// docs/*.md, so that a snippet a user copies cannot rot unnoticed.
//
// How a block is read:
//   - A block is the body of a function returning error, as getting-started
//     says; its `import`, `type`, `func`, `var` and `const` lines at column 0
//     are package-level declarations. A block may end with `return`.
//   - A block with an import declaration must import everything it uses,
//     as a reader copying it would need; a block without one (a short
//     continuation of the page) gets the imports of the package names it uses.
//   - The names a page takes for granted (ctx, pool, store, reg, the
//     getting-started events and their handles) come from the preludes in
//     testdata/snippets: prelude.go for every page, prelude_<page>.go for
//     one page. A name the page declares itself wins over a prelude's.
//   - A variable a block declares must be used, as in Go, unless a later
//     block of the same page uses it (the page is one story). err never gets
//     that pass: every error is checked where it is returned.
//   - A block opts out only visibly: its first line is
//     `// not compiled: <reason>`.
//
// Failures name the Markdown file and line.
func TestDocSnippetsCompile(t *testing.T) {
	goTool := findGoTool(t)
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	pages := []string{"README.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, docs...)

	prelude, err := os.ReadFile("testdata/snippets/prelude.go")
	if err != nil {
		t.Fatal(err)
	}
	overlay := map[string]string{}
	tmp := t.TempDir()
	var pkgs []string
	total := 0
	for _, page := range pages {
		blocks, err := extractGoBlocks(page)
		if err != nil {
			t.Fatal(err)
		}
		if len(blocks) == 0 {
			continue
		}
		total += len(blocks)
		// A block that is a whole file (it starts with a package clause) is
		// its own package, compiled as written: no preludes, no wrapping.
		blocks = slices.DeleteFunc(blocks, func(b goBlock) bool {
			if !isWholeFile(b) {
				return false
			}
			slug := fmt.Sprintf("%s_file%d", pageSlug(page), b.line)
			src := filepath.Join(tmp, slug+".go")
			code := fmt.Sprintf("//line %s:%d\n%s\n", filepath.Join(root, page), b.line, strings.Join(b.lines, "\n"))
			if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "docsnippets_compiled", slug)
			overlay[filepath.Join(dir, "file.go")] = src
			pkgs = append(pkgs, "./"+filepath.ToSlash(filepath.Join("docsnippets_compiled", slug)))
			return true
		})
		if len(blocks) == 0 {
			continue
		}
		files, err := snippetFiles(root, page, blocks)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		declared := map[string]bool{}
		for _, f := range files {
			for n := range topLevelNames(f.src) {
				declared[n] = true
			}
		}
		pagePrelude, err := os.ReadFile(filepath.Join("testdata/snippets", "prelude_"+pageSlug(page)+".go"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if pagePrelude != nil {
			p, err := filterPrelude(pagePrelude, declared)
			if err != nil {
				t.Fatalf("prelude of %s: %v", page, err)
			}
			files = append(files, snippetFile{name: "prelude_page.go", src: p})
			for n := range topLevelNames(p) {
				declared[n] = true
			}
		}
		p, err := filterPrelude(prelude, declared)
		if err != nil {
			t.Fatalf("prelude: %v", err)
		}
		files = append(files, snippetFile{name: "prelude.go", src: p})

		dir := filepath.Join(root, "docsnippets_compiled", pageSlug(page))
		pkgs = append(pkgs, "./"+filepath.ToSlash(filepath.Join("docsnippets_compiled", pageSlug(page))))
		for _, f := range files {
			src := filepath.Join(tmp, pageSlug(page)+"_"+f.name)
			if err := os.WriteFile(src, f.src, 0o644); err != nil {
				t.Fatal(err)
			}
			overlay[filepath.Join(dir, f.name)] = src
		}
	}
	if total == 0 {
		t.Fatal("no ```go blocks found: is the test running in the module root?")
	}
	checkSnippetDeps(t, overlay)
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovPath := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	// Built in the suite's own mode: under `go test -race` every dependency
	// is already in the build cache compiled with -race, and a plain build
	// would compile the whole dependency tree again (minutes on two cores).
	args := []string{"build", "-gcflags=-e", "-overlay", ovPath}
	if raceBuild {
		args = append(args, "-race")
	}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(t.Context(), goTool, args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%d Go blocks of README.md and docs/ do not all compile (go %s):\n%s",
			total, strings.Join(args, " "), strings.ReplaceAll(string(out), root+string(filepath.Separator), ""))
	}
}

// modulePath is the import path of this module.
const modulePath = "github.com/projectorhq/projector"

// checkSnippetDeps fails the test if a snippet (a file of overlay) imports
// a package of the module that docs_deps_test.go does not: that package
// would be compiled twice by a suite run, once by `go test` and once by the
// snippets' build beside it.
func checkSnippetDeps(t *testing.T, overlay map[string]string) {
	t.Helper()
	linked := map[string]bool{modulePath: true}
	deps, err := parser.ParseFile(token.NewFileSet(), "docs_deps_test.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range deps.Imports {
		linked[strings.Trim(imp.Path.Value, `"`)] = true
	}
	missing := map[string]bool{}
	for _, src := range overlay {
		f, err := parser.ParseFile(token.NewFileSet(), src, nil, parser.ImportsOnly)
		if err != nil {
			continue // the build below reports it, with the page's line
		}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if (p == modulePath || strings.HasPrefix(p, modulePath+"/")) && !linked[p] {
				missing[p] = true
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(missing)) {
		t.Errorf("a docs snippet imports %s: add it to docs_deps_test.go, so that the suite compiles it once, before this test", p)
	}
}

// findGoTool returns the go command: the one of the toolchain running the
// test when `go test` says where it is, else the first on PATH.
func findGoTool(t *testing.T) string {
	t.Helper()
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to compile the docs' snippets: %v", err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// goBlock is one ```go block of a Markdown page.
type goBlock struct {
	line  int      // line number of the block's first line of code
	lines []string // the code
}

// optOut is the visible marker a block must carry to be left uncompiled.
var optOut = regexp.MustCompile(`^// not compiled: \S`)

// extractGoBlocks returns the ```go blocks of a Markdown file, without the
// ones that opt out.
func extractGoBlocks(path string) ([]goBlock, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var blocks []goBlock
	var cur *goBlock
	for i, l := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case cur == nil && trimmed == "```go":
			cur = &goBlock{line: i + 2}
		case cur != nil && trimmed == "```":
			if len(cur.lines) == 0 || !optOut.MatchString(cur.lines[0]) {
				blocks = append(blocks, *cur)
			}
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: ```go block never closed", path, cur.line-1)
	}
	return blocks, nil
}

// isWholeFile reports whether a block is a complete Go file: its first
// line that is not a comment or blank is a package clause.
func isWholeFile(b goBlock) bool {
	for _, l := range b.lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "//") {
			continue
		}
		return strings.HasPrefix(l, "package ")
	}
	return false
}

// snippetFile is one generated Go file of a page's package.
type snippetFile struct {
	name string
	src  []byte
}

// chunk is a run of a block's lines that is either package-level
// declarations or statements.
type chunk struct {
	decl, imports bool
	line          int
	lines         []string
}

var declStart = regexp.MustCompile(`^(import|type|func|var|const)[ (]`)

// splitBlock cuts a block into declaration and statement chunks: a
// declaration starts at column 0 with a declaration keyword and runs until
// the next column-0 line that does not close it.
func splitBlock(b goBlock) []chunk {
	var chunks []chunk
	var cur *chunk
	for i, l := range b.lines {
		atCol0 := l != "" && l[0] != ' ' && l[0] != '\t'
		startsDecl := atCol0 && declStart.MatchString(l) && !strings.HasPrefix(l, "func(")
		closes := atCol0 && (l[0] == ')' || l[0] == '}')
		switch {
		case startsDecl:
			chunks = append(chunks, chunk{decl: true, imports: strings.HasPrefix(l, "import"), line: b.line + i})
		case cur != nil && cur.decl && (closes || !atCol0):
		case cur == nil || cur.decl:
			chunks = append(chunks, chunk{line: b.line + i})
		}
		cur = &chunks[len(chunks)-1]
		cur.lines = append(cur.lines, l)
	}
	return chunks
}

// autoImports are the packages a block without an import declaration may
// use by their usual names.
var autoImports = map[string]string{
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"json":        "encoding/json",
	"net":         "net",
	"log":         "log",
	"os":          "os",
	"slog":        "log/slog",
	"time":        "time",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"projector":   "github.com/projectorhq/projector",
	"aggregate":   "github.com/projectorhq/projector/aggregate",
	"cli":         "github.com/projectorhq/projector/cli",
	"console":     "github.com/projectorhq/projector/console",
	"live":        "github.com/projectorhq/projector/live",
	"projection":  "github.com/projectorhq/projector/projection",
	"rebuild":     "github.com/projectorhq/projector/rebuild",
	"saga":        "github.com/projectorhq/projector/saga",
	"search":      "github.com/projectorhq/projector/search",
	"jetstream":   "github.com/projectorhq/projector/stores/jetstream",
	"meilisearch": "github.com/projectorhq/projector/stores/meilisearch",
	"pgsearch":    "github.com/projectorhq/projector/stores/pgsearch",
	"postgres":    "github.com/projectorhq/projector/stores/postgres",
}

// snippetFiles turns a page's blocks into one Go file each, in one package.
func snippetFiles(root, page string, blocks []goBlock) ([]snippetFile, error) {
	abs := filepath.Join(root, page)
	type gen struct {
		body     string // everything after the package clause and imports
		imports  string
		hasImp   bool
		declared []string // variables the function body declares at its top level
		idents   map[string]bool
	}
	gens := make([]gen, len(blocks))
	for i, b := range blocks {
		var imports, decls, stmts strings.Builder
		g := gen{}
		for _, c := range splitBlock(b) {
			w := &stmts
			switch {
			case c.imports:
				w, g.hasImp = &imports, true
			case c.decl:
				w = &decls
			}
			fmt.Fprintf(w, "//line %s:%d\n%s\n", abs, c.line, strings.Join(c.lines, "\n"))
		}
		g.imports = imports.String()
		g.body = decls.String() + "\nfunc _() error {\n" + stmts.String() + "\n\t/*BLANKS*/\n\treturn nil\n}\n"
		f, err := parser.ParseFile(token.NewFileSet(), abs, "package snippets\n"+g.imports+g.body, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: the block does not parse as declarations and statements: %v", page, b.line, err)
		}
		g.idents = map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				g.idents[id.Name] = true
			}
			return true
		})
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "_" || fn.Recv != nil {
				continue
			}
			for _, s := range fn.Body.List {
				if as, ok := s.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
					for _, l := range as.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name != "_" && id.Name != "err" {
							g.declared = append(g.declared, id.Name)
						}
					}
				}
			}
		}
		if !g.hasImp {
			f, err := parser.ParseFile(token.NewFileSet(), abs, "package snippets\n"+g.body, 0)
			if err != nil {
				return nil, err
			}
			var paths []string
			for _, id := range f.Unresolved {
				if p, ok := autoImports[id.Name]; ok && !slices.Contains(paths, p) && usedAsPackage(f, id.Name) {
					paths = append(paths, p)
				}
			}
			sort.Strings(paths)
			for _, p := range paths {
				g.imports += fmt.Sprintf("import %q\n", p)
			}
		}
		gens[i] = g
	}
	var files []snippetFile
	for i, g := range gens {
		var blanks []string
		for _, n := range g.declared {
			for _, later := range gens[i+1:] {
				if later.idents[n] {
					blanks = append(blanks, "_ = "+n)
					break
				}
			}
		}
		body := strings.Replace(g.body, "/*BLANKS*/", strings.Join(blanks, "; "), 1)
		files = append(files, snippetFile{
			name: fmt.Sprintf("block_%04d.go", blocks[i].line),
			src:  []byte("package snippets\n\n" + g.imports + "\n" + body),
		})
	}
	return files, nil
}

// usedAsPackage reports whether name appears as the X of a selector.
func usedAsPackage(f *ast.File, name string) bool {
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := s.X.(*ast.Ident); ok && id.Name == name {
				found = true
			}
		}
		return !found
	})
	return found
}

// topLevelNames returns the package-level names a Go file declares.
func topLevelNames(src []byte) map[string]bool {
	names := map[string]bool{}
	f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.SkipObjectResolution)
	if err != nil {
		return names
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name != "_" {
				names[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					names[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names
}

// filterPrelude drops the prelude's declarations of names the page declares
// itself, and the imports nothing left uses.
func filterPrelude(src []byte, declared map[string]bool) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "prelude.go", src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString("package snippets\n\n")
	text := func(n ast.Node) string {
		return string(src[fset.Position(n.Pos()).Offset:fset.Position(n.End()).Offset])
	}
	var kept []ast.Node
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !declared[d.Name.Name] {
				kept = append(kept, d)
			}
		case *ast.GenDecl:
			if d.Tok == token.IMPORT {
				continue
			}
			for _, s := range d.Specs {
				var names []string
				switch s := s.(type) {
				case *ast.TypeSpec:
					names = []string{s.Name.Name}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names = append(names, n.Name)
					}
				}
				if !slices.ContainsFunc(names, func(n string) bool { return declared[n] }) {
					kept = append(kept, s)
				}
			}
		}
	}
	used := map[string]bool{}
	for _, n := range kept {
		ast.Inspect(n, func(n ast.Node) bool {
			if s, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := s.X.(*ast.Ident); ok {
					used[id.Name] = true
				}
			}
			return true
		})
	}
	for _, imp := range f.Imports {
		p := strings.Trim(imp.Path.Value, `"`)
		name := p[strings.LastIndex(p, "/")+1:]
		if name == "v5" {
			name = "pgx"
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if used[name] {
			fmt.Fprintf(&out, "import %s %s\n", name, imp.Path.Value)
		}
	}
	for _, n := range kept {
		switch n := n.(type) {
		case *ast.TypeSpec:
			fmt.Fprintf(&out, "\ntype %s\n", text(n))
		case *ast.ValueSpec:
			fmt.Fprintf(&out, "\nvar %s\n", text(n))
		default:
			fmt.Fprintf(&out, "\n%s\n", text(n))
		}
	}
	return out.Bytes(), nil
}

// pageSlug names a page's package: README.md → readme, docs/search.md →
// search.
func pageSlug(page string) string {
	return strings.ToLower(strings.TrimSuffix(filepath.Base(page), ".md"))
}
