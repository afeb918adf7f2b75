// Package migrations holds Projector's SQL schema as numbered files,
// embedded in the binary so a deployment never runs a schema its code does
// not match.
//
// Files are named NNNN_description.sql and are applied in order by the
// migrator in stores/postgres. Each refers to its schema as {{schema}}, which
// the migrator replaces with the configured, quoted schema name, so several
// Projector schemas can live side by side in one database.
package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
)

//go:embed *.sql
var files embed.FS

// Migration is one schema step.
type Migration struct {
	Version int
	Name    string
	// SQL is the file's text with the {{schema}} placeholder still in it.
	SQL string
}

// SchemaPlaceholder is what a migration writes where the schema name goes.
const SchemaPlaceholder = "{{schema}}"

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// All returns every migration in version order. It fails if a file name
// breaks the pattern or two files share a version, which a test guards.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q: want NNNN_description.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		if prev, ok := seen[v]; ok {
			return nil, fmt.Errorf("migration version %d used by %q and %q", v, prev, e.Name())
		}
		seen[v] = e.Name()
		body, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must run 1, 2, 3…: found %d at place %d", m.Version, i+1)
		}
	}
	return out, nil
}
