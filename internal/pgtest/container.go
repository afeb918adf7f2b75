//go:build testcontainers

package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// The testcontainers fallback is behind a build tag: it links Docker's client
// into every test binary, which machines with PostgreSQL installed do not
// need. Where Docker runs and PostgreSQL does not:
//
//	go test -tags testcontainers ./...
func init() {
	startContainer = func(ctx context.Context) (string, func() error, error) {
		ctr, err := testcontainers.Run(ctx, "postgres:16-alpine",
			testcontainers.WithEnv(map[string]string{"POSTGRES_PASSWORD": "projector", "POSTGRES_DB": "projector_test"}),
			testcontainers.WithExposedPorts("5432/tcp"),
			testcontainers.WithWaitStrategyAndDeadline(2*time.Minute,
				wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
				wait.ForListeningPort("5432/tcp")),
		)
		if err != nil {
			if ctr != nil {
				_ = ctr.Terminate(context.Background())
			}
			return "", nil, fmt.Errorf("testcontainers: %w", err)
		}
		host, err := ctr.Host(ctx)
		if err != nil {
			_ = ctr.Terminate(context.Background())
			return "", nil, fmt.Errorf("testcontainers: host: %w", err)
		}
		port, err := ctr.MappedPort(ctx, "5432/tcp")
		if err != nil {
			_ = ctr.Terminate(context.Background())
			return "", nil, fmt.Errorf("testcontainers: port: %w", err)
		}
		url := fmt.Sprintf("postgres://postgres:projector@%s:%s/projector_test?sslmode=disable", host, port.Port())
		return url, func() error { return ctr.Terminate(context.Background()) }, nil
	}
}
