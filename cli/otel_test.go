package cli

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// Tracing is off unless the OTEL_* environment names an OTLP endpoint or
// exporter; a value run cannot honour is a usage error (exit 2).
func TestRunTracingFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env       map[string]string
		want      bool
		wantUsage bool
	}{
		{env: nil, want: false},
		{env: map[string]string{envOTelServiceName: "svc"}, want: false},
		{env: map[string]string{envOTLPEndpoint: "http://127.0.0.1:4318"}, want: true},
		{env: map[string]string{envOTLPTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, want: true},
		{env: map[string]string{envOTelTracesExporter: "otlp"}, want: true},
		{env: map[string]string{envOTLPEndpoint: "http://x", envOTelTracesExporter: "none"}, want: false},
		{env: map[string]string{envOTLPEndpoint: "http://x", envOTelSDKDisabled: "true"}, want: false},
		{env: map[string]string{envOTelTracesExporter: "zipkin"}, wantUsage: true},
		{env: map[string]string{envOTLPEndpoint: "http://x", envOTLPProtocol: "grpc"}, wantUsage: true},
	} {
		tp, err := newTracerProvider(context.Background(), envOf(tc.env))
		if tc.wantUsage {
			if !errors.As(err, new(usageError)) || ExitCode(err) != ExitUsage {
				t.Errorf("%v: err %v, want a usage error", tc.env, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.env, err)
			continue
		}
		if (tp != nil) != tc.want {
			t.Errorf("%v: provider installed %v, want %v", tc.env, tp != nil, tc.want)
		}
		if tp != nil {
			_ = tp.Shutdown(context.Background())
		}
	}
}

// The provider run builds exports its spans over OTLP/HTTP to the endpoint.
func TestRunTracingExportsOTLP(t *testing.T) {
	t.Parallel()
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp, err := newTracerProvider(ctx, envOf(map[string]string{envOTelTracesExporter: "otlp"}), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil || tp == nil {
		t.Fatalf("provider %v, err %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(ctx, "batch")
	span.End()
	if err := tp.Shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("no OTLP export reached the endpoint")
	}
}

// The resource's service name is OTEL_SERVICE_NAME as getenv gives it,
// "projector" without one.
func TestRunTracingServiceName(t *testing.T) {
	t.Parallel()
	for env, want := range map[string]string{"": defaultOTelServiceName, "helpdesk": "helpdesk"} {
		ctx := context.Background()
		tp, err := newTracerProvider(ctx, envOf(map[string]string{envOTelTracesExporter: "otlp", envOTelServiceName: env}))
		if err != nil {
			t.Fatal(err)
		}
		_, span := tp.Tracer("test").Start(ctx, "x")
		ro, ok := span.(interface{ Resource() *resource.Resource })
		if !ok {
			t.Fatal("SDK span without Resource")
		}
		got, _ := ro.Resource().Set().Value("service.name")
		span.End()
		_ = tp.Shutdown(ctx)
		if os.Getenv(envOTelServiceName) == "" && got.AsString() != want {
			t.Errorf("OTEL_SERVICE_NAME=%q: service.name %q, want %q", env, got.AsString(), want)
		}
	}
}

// An OTLP endpoint that is not an http(s) URL with a host is a bad
// command line (exit 2) whose message never holds the URL, which may carry
// credentials: the exporter took it, logged it whole to standard error
// (password included) and exported to its default endpoint instead.
func TestRunTracingBadEndpointIsUsageErrorWithoutTheURL(t *testing.T) {
	t.Parallel()
	for _, endpoint := range []string{
		"http://user:s3cret@127.0.0.1:badport",
		"http://user:s3cret@[::1",
		"http://user:s3cret%zz@127.0.0.1:4318",
		"user:s3cret@127.0.0.1:4318",
		"ftp://user:s3cret@127.0.0.1:4318",
		"http://user:s3cret@/v1/traces",
	} {
		for _, key := range []string{envOTLPEndpoint, envOTLPTracesEndpoint} {
			tp, err := newTracerProvider(context.Background(), envOf(map[string]string{key: endpoint}))
			if tp != nil {
				_ = tp.Shutdown(context.Background())
			}
			if ExitCode(err) != ExitUsage || !strings.Contains(message(err), key) {
				t.Errorf("%s=%s: err %v, want a usage error naming the variable", key, endpoint, err)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: the error shows the password: %v", key, err)
			}
		}
	}
}

// recordingTransport answers every request with 200 and remembers its URLs.
type recordingTransport struct {
	mu   sync.Mutex
	urls []string
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	rt.urls = append(rt.urls, r.URL.String())
	rt.mu.Unlock()
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
}

// OTEL_TRACES_EXPORTER=otlp with no endpoint exports to the specification's
// default, http://localhost:4318, as docs/observability.md says: the plain
// HTTP a local collector or Jaeger serves. The Go exporter's own default is
// https://localhost:4318, which such a collector refuses, so a `run` with
// only OTEL_TRACES_EXPORTER=otlp exported nothing.
func TestRunTracingDefaultEndpointIsPlainHTTP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt := &recordingTransport{}
	tp, err := newTracerProvider(ctx, envOf(map[string]string{envOTelTracesExporter: "otlp"}),
		otlptracehttp.WithHTTPClient(&http.Client{Transport: rt}))
	if err != nil || tp == nil {
		t.Fatalf("provider %v, err %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(ctx, "batch")
	span.End()
	if err := tp.Shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.urls) == 0 {
		t.Fatal("nothing exported")
	}
	for _, u := range rt.urls {
		if u != "http://localhost:4318/v1/traces" {
			t.Errorf("exported to %s, want http://localhost:4318/v1/traces", u)
		}
	}
}
