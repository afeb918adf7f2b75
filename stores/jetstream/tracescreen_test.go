//go:build tracescreen

package jetstream_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/projectorhq/projector/internal/browsertest"
	"github.com/projectorhq/projector/internal/jaegertest"
)

// The trace screenshot of docs/observability.md: not part of the suite
// (build tag tracescreen); docs/observability.md says how to run it.
const (
	// envJaegerUI names a built jaeger-ui (the directory holding its
	// index.html) for Jaeger to serve.
	envJaegerUI = "PROJECTOR_JAEGER_UI"
	// envTracePNG names the file the screenshot goes to.
	envTracePNG = "PROJECTOR_TRACE_PNG"
	// maxTracePNG is the most the screenshot may weigh in the repository.
	maxTracePNG = 400 << 10
)

// TestTraceScreenshot runs the request of TestPromise17_OneTraceEndToEnd
// (HTTP request → append with an inline projection → saga step → the
// event it emits → relay → the claims consumer in another process), both
// processes exporting to a real Jaeger serving the jaeger-ui at
// $PROJECTOR_JAEGER_UI, and takes a screenshot of the request's trace in
// Jaeger's trace view with headless Chromium, into $PROJECTOR_TRACE_PNG
// (default docs/img/trace.png).
func TestTraceScreenshot(t *testing.T) {
	ui := os.Getenv(envJaegerUI)
	if ui == "" {
		t.Fatalf("set %s to a built jaeger-ui (see docs/observability.md)", envJaegerUI)
	}
	out := os.Getenv(envTracePNG)
	if out == "" {
		out = filepath.Join("..", "..", "docs", "img", "trace.png")
	}
	chromium := browsertest.Chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := jaegertest.Start(ctx, t, jaegertest.Options{UIAssets: ui})

	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLP))
	must(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "helpdesk"))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	run := runOneTrace(t, tp, nil, childOTLPEnv+"="+j.OTLP, childServiceEnv+"=billing")
	must(t, tp.ForceFlush(ctx))

	traceID := run.client.TraceID().String()
	want := []string{"client", "POST /tickets", "append ticket", "step escalate", "append followup", "process p17"}
	var ops map[string]string
	j.Poll(ctx, t, "the whole trace in Jaeger", func() bool {
		tr, _ := j.Trace(ctx, t, traceID)
		ops = tr.Operations()
		return !slices.ContainsFunc(want, func(op string) bool { return ops[op] == "" })
	})
	if ops["process p17"] != "billing" || ops["append ticket"] != "helpdesk" {
		t.Fatalf("trace %s: spans by service %v, want the claims consumer's in billing and the rest in helpdesk", traceID, ops)
	}
	t.Logf("trace %s: %v", traceID, ops)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true),
		chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	page := j.Query + "/trace/" + traceID
	if err := chromedp.Do(bctx,
		chromedp.EmulateViewport(1400, 930), // every row with the append's details open
		chromedp.Navigate(page),
		// A row per span once the trace has loaded and laid out.
		chromedp.WaitVisible(`.span-row`),
		// Open the append's details, and its attributes ("Tags") in them.
		chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('.span-row')]
			.find(r => r.querySelector('.endpoint-name')?.textContent === 'append ticket')
			.querySelector('.span-name').click()`),
		chromedp.WaitVisible(`.AccordianKeyValues--header`),
		chromedp.Click(`.AccordianKeyValues--header`),
		chromedp.Sleep(time.Second), // let the layout settle before the picture (not synchronisation: the rows are there)
	); err != nil {
		t.Fatalf("trace view %s: %v", page, err)
	}
	png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot of %s: %v", page, err)
	}
	if len(png) > maxTracePNG {
		t.Fatalf("screenshot is %d KiB, more than %d KiB", len(png)>>10, maxTracePNG>>10)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d KiB) of trace %s", out, len(png)>>10, traceID)
}
