package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The standard OpenTelemetry environment variables `run` reads to decide
// whether to export traces. The exporter reads the rest of OTEL_EXPORTER_OTLP_*
// (headers, timeout, certificates) itself, and the SDK reads OTEL_TRACES_SAMPLER,
// OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
const (
	envOTelSDKDisabled     = "OTEL_SDK_DISABLED"
	envOTelTracesExporter  = "OTEL_TRACES_EXPORTER"
	envOTLPEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envOTLPTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envOTLPProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envOTLPTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envOTelServiceName     = "OTEL_SERVICE_NAME"
	otlpProtocolHTTP       = "http/protobuf"
	defaultOTelServiceName = "projector"
	defaultOTLPTracesURL   = "http://localhost:4318/v1/traces"
)

// otelWanted reports whether the environment asks for trace export: an OTLP
// endpoint is set, or OTEL_TRACES_EXPORTER is otlp; and neither
// OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none says no. With none of
// these set, `run` installs nothing and Projector traces nothing.
func otelWanted(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(envOTelSDKDisabled)), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(getenv(envOTelTracesExporter)); exp {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
	default:
		return false, usageError{fmt.Errorf("$%s=%s: projector run exports traces over OTLP only (otlp or none)", envOTelTracesExporter, quoted(exp))}
	}
	return getenv(envOTLPEndpoint) != "" || getenv(envOTLPTracesEndpoint) != "", nil
}

// setUpTracing installs, when the environment asks for it (see
// otelWanted), an SDK TracerProvider exporting over OTLP/HTTP as the global
// provider, which the store, the dispatcher, the saga runner and the relay
// use when given none, and the W3C propagator. It returns the function that
// flushes and shuts the provider down, a no-op when nothing was installed.
func setUpTracing(ctx context.Context, getenv func(string) string) (shutdown func(context.Context) error, enabled bool, err error) {
	tp, err := newTracerProvider(ctx, getenv)
	if err != nil || tp == nil {
		return func(context.Context) error { return nil }, false, err
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, true, nil
}

// newTracerProvider returns the provider the environment asks for, nil
// when it asks for none. opts go to the exporter after what it reads from
// OTEL_EXPORTER_OTLP_* (tests name their endpoint).
func newTracerProvider(ctx context.Context, getenv func(string) string, opts ...otlptracehttp.Option) (*sdktrace.TracerProvider, error) {
	wanted, err := otelWanted(getenv)
	if err != nil || !wanted {
		return nil, err
	}
	protocol := getenv(envOTLPTracesProtocol)
	if protocol == "" {
		protocol = getenv(envOTLPProtocol)
	}
	if protocol != "" && protocol != otlpProtocolHTTP {
		return nil, usageError{fmt.Errorf("$%s=%s: projector run exports OTLP over %s only", envOTLPProtocol, quoted(protocol), otlpProtocolHTTP)}
	}
	for _, key := range []string{envOTLPEndpoint, envOTLPTracesEndpoint} {
		if err := checkOTLPEndpoint(getenv(key)); err != nil {
			return nil, usageError{fmt.Errorf("$%s: %w", key, err)}
		}
	}
	if getenv(envOTLPEndpoint) == "" && getenv(envOTLPTracesEndpoint) == "" {
		// The specification's default for OTLP/HTTP is plain HTTP; the Go
		// exporter's own is https://localhost:4318, which a local collector
		// or Jaeger (plain HTTP on 4318) refuses.
		opts = append([]otlptracehttp.Option{otlptracehttp.WithEndpointURL(defaultOTLPTracesURL)}, opts...)
	}
	exporter, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// The service name as getenv says (default "projector"); WithFromEnv,
	// later, reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES from the
	// process environment and wins where it sets them.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", cmp.Or(getenv(envOTelServiceName), defaultOTelServiceName))),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// The sampler defaults to parent-based always-on and follows
	// OTEL_TRACES_SAMPLER when set (the SDK reads it).
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res)), nil
}

// checkOTLPEndpoint refuses an OTLP endpoint that is not an http or https
// URL with a host ("" is unset). The exporter itself logs one it cannot
// parse whole to standard error, password included, and exports to its
// default endpoint instead; so the message here never holds the URL or
// the parser's error, which quotes it.
func checkOTLPEndpoint(v string) error {
	if v == "" {
		return nil
	}
	u, err := neturl.Parse(v)
	switch {
	case err != nil:
		return errors.New("not a URL (not printed: it may hold credentials): want http(s)://host:port")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("not an http or https URL (not printed: it may hold credentials): want http(s)://host:port")
	case u.Host == "":
		return errors.New("a URL without a host (not printed: it may hold credentials): want http(s)://host:port")
	}
	return nil
}
