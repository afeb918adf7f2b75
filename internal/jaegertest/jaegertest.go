// Package jaegertest starts a real Jaeger (all-in-one, memory storage) on
// loopback ports for the tests and tools that export spans to it and read
// them back through its query API: the binary scripts/jaeger-bin builds.
package jaegertest

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
)

// Version is the Jaeger release scripts/jaeger-bin builds.
const Version = "v1.76.0"

// EnvBin names the Jaeger binary to use instead of the cached build.
const EnvBin = "PROJECTOR_JAEGER_BIN"

// Bin is the Jaeger binary scripts/jaeger-bin builds: named by
// $PROJECTOR_JAEGER_BIN, else looked for where the script caches it
// ($PROJECTOR_TOOLS_CACHE, default the user's cache directory/projector).
func Bin() string {
	if bin := os.Getenv(EnvBin); bin != "" {
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
	return filepath.Join(cache, "jaeger-"+Version, "jaeger")
}

// config is an all-in-one Jaeger on loopback ports: OTLP/HTTP in, memory
// storage, the query API (and the UI, when assets are given) out, nothing
// else listening.
const config = `service:
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
%s  jaeger_storage:
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

// Options configure [Start].
type Options struct {
	// UIAssets is a built jaeger-ui (the directory holding its
	// index.html) for the query port to serve; empty serves the API only
	// (the Go module's Jaeger has no UI assets).
	UIAssets string
}

// Jaeger is a running Jaeger, killed when the test ends.
type Jaeger struct {
	// Query is the query API's (and the UI's) base URL.
	Query string
	// OTLP is the URL spans are exported to over OTLP/HTTP
	// (…/v1/traces).
	OTLP string
	out  *strings.Builder
}

// Start starts Jaeger on free loopback ports and waits for its query API.
// Without the binary the test is skipped, but under CI it fails (.ci/run
// builds it with scripts/jaeger-bin).
func Start(ctx context.Context, t testing.TB, opts Options) *Jaeger {
	t.Helper()
	bin := Bin()
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Jaeger binary %q: %v (build it with scripts/jaeger-bin)", bin, err)
		}
		t.Skipf("no Jaeger binary at %q (scripts/jaeger-bin builds it)", bin)
	}
	ui := ""
	if opts.UIAssets != "" {
		if _, err := os.Stat(filepath.Join(opts.UIAssets, "index.html")); err != nil {
			t.Fatalf("jaeger-ui assets: %v", err)
		}
		b, err := json.Marshal(opts.UIAssets) // a YAML string
		if err != nil {
			t.Fatal(err)
		}
		ui = fmt.Sprintf("    ui:\n      assets_path: %s\n", b)
	}
	queryPort, grpcPort, otlpPort := FreePort(t), FreePort(t), FreePort(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, queryPort, grpcPort, ui, otlpPort), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--config", cfg)
	j := &Jaeger{Query: fmt.Sprintf("http://127.0.0.1:%d", queryPort), OTLP: fmt.Sprintf("http://127.0.0.1:%d/v1/traces", otlpPort),
		out: &strings.Builder{}}
	cmd.Stdout, cmd.Stderr = j.out, j.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("jaeger output:\n%s", j.out.String())
		}
	})
	j.Poll(ctx, t, "Jaeger's query API", func() bool {
		code, _, err := j.Get(ctx, "/api/services")
		return err == nil && code == http.StatusOK
	})
	return j
}

// Get fetches path from the query API.
func (j *Jaeger) Get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+path, nil)
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

// Poll calls cond until it holds, failing the test when ctx ends first.
func (j *Jaeger) Poll(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond) // polling an outside process, with a deadline
	}
}

// Trace is the part of the query API's answer to /api/traces/<id> the
// tests read.
type Trace struct {
	Data []struct {
		Spans []struct {
			OperationName string `json:"operationName"`
			ProcessID     string `json:"processID"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// Trace fetches one trace by its id (hex); ok is false until Jaeger has
// it.
func (j *Jaeger) Trace(ctx context.Context, t testing.TB, id string) (tr Trace, ok bool) {
	t.Helper()
	code, body, err := j.Get(ctx, "/api/traces/"+id)
	if err != nil || code != http.StatusOK {
		return Trace{}, false
	}
	if err := json.Unmarshal(body, &tr); err != nil {
		t.Fatalf("query API answer %s: %v", body, err)
	}
	return tr, len(tr.Data) == 1
}

// Operations returns the operation names of a trace's spans, each with
// the service that reported it ("append ticket": "helpdesk").
func (tr Trace) Operations() map[string]string {
	ops := map[string]string{}
	if len(tr.Data) == 0 {
		return ops
	}
	for _, s := range tr.Data[0].Spans {
		ops[s.OperationName] = tr.Data[0].Processes[s.ProcessID].ServiceName
	}
	return ops
}

// FreePort returns a loopback port nothing listens on right now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
