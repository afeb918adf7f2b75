package aggregate_test

import (
	"testing"

	"github.com/projectorhq/projector/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
