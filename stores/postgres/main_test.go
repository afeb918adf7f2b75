package postgres_test

import (
	"os"
	"testing"

	"github.com/projectorhq/projector/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(importChildEnv) != "" {
		os.Exit(importChild()) // the helper process of TestHistory_ImportCrashResumes
	}
	pgtest.Main(m)
}
