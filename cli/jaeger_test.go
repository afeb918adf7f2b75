package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// jaegerBin is the Jaeger binary scripts/jaeger-bin builds: named by
// $PROJECTOR_JAEGER_BIN, else looked for where the script caches it.
func jaegerBin() string {
	if bin := os.Getenv("PROJECTOR_JAEGER_BIN"); bin != "" {
		return bin
	}
	cache := os.Getenv("PROJECTOR_TOOLS_CACHE")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(dir, "projector")
	}
	return filepath.Join(cache, "jaeger-v1.76.0", "jaeger")
}

// freePort returns a loopback port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// jaegerConfig is an all-in-one Jaeger on loopback ports: OTLP/HTTP in,
// memory storage, the query API out, nothing else listening.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 1000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// jaegerTrace is the part of Jaeger's query API answer the test reads.
type jaegerTrace struct {
	Data []struct {
		Spans []struct {
			OperationName string `json:"operationName"`
		} `json:"spans"`
	} `json:"data"`
}

// TestTracingJaegerEndToEnd exports Projector's spans over OTLP, the way
// `projector run` does, to a real Jaeger started on loopback ports, and
// reads the request's trace back through Jaeger's query API: the request,
// its append, and the dispatcher's batch (a trace of its own, linked).
// Skipped only when the binary is missing and CI is not set; under CI=true
// a missing binary fails (.ci/run builds it with scripts/jaeger-bin).
func TestTracingJaegerEndToEnd(t *testing.T) {
	t.Parallel()
	bin := jaegerBin()
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Jaeger binary %q: %v (build it with scripts/jaeger-bin)", bin, err)
		}
		t.Skipf("no Jaeger binary at %q (scripts/jaeger-bin builds it)", bin)
	}
	queryPort, grpcPort, otlpPort := freePort(t), freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, queryPort, grpcPort, otlpPort), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--config", cfg)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("jaeger output:\n%s", out.String())
		}
	})
	query := fmt.Sprintf("http://127.0.0.1:%d", queryPort)
	get := func(path string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, query+path, nil)
		if err != nil {
			return 0, nil, err
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		return res.StatusCode, body, err
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if ctx.Err() != nil {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond) // polling an outside process, with a deadline
		}
	}
	poll("Jaeger's query API", func() bool {
		code, _, err := get("/api/services")
		return err == nil && code == http.StatusOK
	})

	tp, err := newTracerProvider(ctx, func(k string) string {
		return map[string]string{envOTelTracesExporter: "otlp", envOTelServiceName: "projector-e2e"}[k]
	}, otlptracehttp.WithEndpointURL(fmt.Sprintf("http://127.0.0.1:%d/v1/traces", otlpPort)))
	if err != nil || tp == nil {
		t.Fatalf("tracer provider %v: %v", tp, err)
	}
	types := testevents.New()
	store := pgtest.Store(t, types.Registry, postgres.Config{TracerProvider: tp})
	rctx, request := tp.Tracer("e2e").Start(ctx, "request")
	err = pgx.BeginFunc(rctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(rctx, tx, projector.Stream("ticket", "jaeger"), projector.NoStream, testevents.TicketOpened{Title: "traced"})
		return err
	})
	request.End()
	if err != nil {
		t.Fatal(err)
	}
	p := projection.NewAsync("jaeger_e2e", projection.AsyncConfig{})
	if err := projection.OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tp.Shutdown(ctx); err != nil { // flushes the batcher
		t.Fatal(err)
	}

	traceID := request.SpanContext().TraceID().String()
	var got jaegerTrace
	poll("the request's trace in Jaeger", func() bool {
		code, body, err := get("/api/traces/" + traceID)
		if err != nil || code != http.StatusOK {
			return false
		}
		got = jaegerTrace{}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("query API answer %s: %v", body, err)
		}
		return len(got.Data) == 1 && len(got.Data[0].Spans) >= 2
	})
	names := map[string]bool{}
	for _, s := range got.Data[0].Spans {
		names[s.OperationName] = true
	}
	if !names["request"] || !names["append ticket"] {
		t.Fatalf("trace %s in Jaeger has spans %v, want request and append ticket", traceID, names)
	}
	poll("the batch span in Jaeger", func() bool {
		code, body, err := get("/api/traces?service=projector-e2e&operation=" + strings.ReplaceAll("process jaeger_e2e", " ", "%20"))
		return err == nil && code == http.StatusOK && strings.Contains(string(body), traceID) // its link names the append's trace
	})
}
