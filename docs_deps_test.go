package projector_test

// The packages the docs' snippets import, linked into this test binary for
// TestDocSnippetsCompile's sake: `go test` compiles them (in the suite's
// mode, -race under `make test`) before this binary starts, so the test's
// own `go build` of the snippets finds every dependency in the build cache
// and compiles only the snippets. Without them the build compiled the whole
// tree a second time, beside the suite's compile of the same packages (154 s
// of a cold-cache `go test -race ./...` on two cores). TestDocSnippetsCompile
// fails if a snippet imports a package of the module not listed here.
import (
	_ "github.com/projectorhq/projector/aggregate"
	_ "github.com/projectorhq/projector/cli"
	_ "github.com/projectorhq/projector/console"
	_ "github.com/projectorhq/projector/live"
	_ "github.com/projectorhq/projector/projection"
	_ "github.com/projectorhq/projector/projection/projectiontest"
	_ "github.com/projectorhq/projector/rebuild"
	_ "github.com/projectorhq/projector/saga"
	_ "github.com/projectorhq/projector/saga/sagatest"
	_ "github.com/projectorhq/projector/search"
	_ "github.com/projectorhq/projector/stores/jetstream"
	_ "github.com/projectorhq/projector/stores/meilisearch"
	_ "github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	_ "github.com/projectorhq/projector/stores/pgsearch"
	_ "github.com/projectorhq/projector/stores/postgres"
)
