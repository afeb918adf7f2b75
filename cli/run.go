package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/hostcheck"
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// runConfig configures the daemon `run` starts.
type runConfig struct {
	// HTTPAddr serves /metrics, /healthz and /readyz; empty disables it.
	HTTPAddr string
	// InstanceID identifies this process; default $PROJECTOR_INSTANCE_ID or
	// a random UUID.
	InstanceID string
	// StopTimeout bounds the graceful stop: running batches get this long
	// to finish before they are rolled back.
	StopTimeout time.Duration
	// InstanceExpiry is projection.Config.InstanceExpiry: how long this
	// instance may go unseen before its per-instance shards stop holding
	// retention back.
	InstanceExpiry time.Duration
	// ConsolePayloads shows event payloads on the console's single
	// dead-letter view and saga states on its single saga instance view
	// (console.Config.ShowPayloads).
	ConsolePayloads bool
	// NoConsole serves no console, only /metrics, /healthz and /readyz.
	NoConsole bool
	// ConsoleAllowedHosts are the names the console (and its live tail)
	// answers to besides the --http-addr host, localhost names and IP
	// addresses (console.Config.AllowedHosts): its names behind a proxy.
	ConsoleAllowedHosts []string
	// StartRetry is how long a start-up whose connection fails is retried
	// (openForRun); 0 means not at all.
	StartRetry time.Duration
}

func (a *App) runCmd() *cobra.Command {
	var cfg runConfig
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the dispatcher for this binary's projections, with /metrics, /healthz and /readyz",
		Long: `run starts the dispatcher daemon for the async projections and sagas compiled into
this binary, with a runner that fires the sagas' timeouts, carries out the rebuilds
requested for its inline projections (those that declare their tables; a binary
with only inline projections runs for that alone), and serves, on --http-addr:

  /metrics   Prometheus metrics (projector_* and Go runtime)
  /healthz   200 while the process runs
  /readyz    200 while the dispatcher runs and the database answers, else 503
  /console/  the operator console (docs/console.md): consumers, horizon, dead
             letters, rebuilds, sagas, live updates; read-only unless
             $` + console.EnvToken + ` holds the operator token

A start-up whose database connection fails (refused, terminated, the server
restarting) is retried with backoff, each retry logged, for up to --start-retry;
a refused login, a missing database or pending migrations end it at once.

SIGINT or SIGTERM stops it gracefully: running batches get --stop-timeout to
finish, then roll back (nothing is lost; they are applied again later). A signal
during start-up stops it with exit code 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd.Context(), cfg) },
	}
	cmd.Flags().StringVar(&cfg.HTTPAddr, "http-addr", "127.0.0.1:9464", "address for /metrics, /healthz, /readyz (empty: no HTTP)")
	cmd.Flags().StringVar(&cfg.InstanceID, "instance-id", "", "this process's instance id (default $"+projection.EnvInstanceID+" or a random UUID)")
	cmd.Flags().DurationVar(&cfg.StopTimeout, "stop-timeout", 30*time.Second, "how long running batches may take to finish on shutdown (0 to 1h)")
	cmd.Flags().BoolVar(&cfg.ConsolePayloads, "console-payloads", false, "show event payloads on the console's dead-letter view and saga states on its saga instance view (they may carry personal data)")
	cmd.Flags().BoolVar(&cfg.NoConsole, "no-console", false, "serve no operator console on --http-addr")
	cmd.Flags().StringSliceVar(&cfg.ConsoleAllowedHosts, "console-allowed-hosts", nil,
		"host names the console answers to besides the --http-addr host, localhost and IP addresses: its names behind a proxy (comma-separated; *.example.com for the names under example.com); any other Host header gets 421")
	cmd.Flags().DurationVar(&cfg.StartRetry, "start-retry", DefaultStartRetry, "how long to keep retrying, with backoff, a start-up whose database connection fails (0: exit at once; at most 1h)")
	cmd.Flags().DurationVar(&cfg.InstanceExpiry, "instance-expiry", projection.DefaultInstanceExpiry,
		fmt.Sprintf("how long this instance may go unseen before its per-instance shards stop holding retention back (%s to %s)", human(minInstanceExpiry), human(projection.MaxInstanceExpiry)))
	return cmd
}

// consoleTailName is the consumer name of the console's live tail: one
// per-instance shard per `run` process, shown by `status` like any other.
const consoleTailName = "console_tail"

// maxStopTimeout is the longest --stop-timeout: a graceful stop that waits
// longer is a hung one.
const maxStopTimeout = time.Hour

// minInstanceExpiry is the shortest --instance-expiry: as many heartbeats
// as the dispatcher requires at its default heartbeat.
const minInstanceExpiry = projection.MinExpiryHeartbeats * projection.DefaultHeartbeatEvery

// run is the `run` command: it runs until ctx is cancelled, then stops
// gracefully.
func (a *App) run(ctx context.Context, cfg runConfig) (err error) {
	started := false
	defer func() {
		// SIGINT or SIGTERM before the dispatcher ran is a request to stop,
		// answered by stopping: not a failure to report.
		if err != nil && !started && ctx.Err() != nil && !errors.As(err, new(usageError)) {
			fmt.Fprintf(a.out, "%s run: stopped during start-up\n", a.cfg.Name)
			err = nil
		}
	}()
	if cfg.StopTimeout < 0 || cfg.StopTimeout > maxStopTimeout {
		return usageError{fmt.Errorf("--stop-timeout %v: want 0 (roll running batches back at once) up to %s", cfg.StopTimeout, human(maxStopTimeout))}
	}
	if cfg.InstanceID != "" {
		if err := checkPrintableName("--instance-id", cfg.InstanceID); err != nil {
			return err
		}
	}
	if cfg.InstanceExpiry < minInstanceExpiry || cfg.InstanceExpiry > projection.MaxInstanceExpiry {
		return usageError{fmt.Errorf("--instance-expiry %v: want between %s and %s", cfg.InstanceExpiry, human(minInstanceExpiry), human(projection.MaxInstanceExpiry))}
	}
	if cfg.StartRetry < 0 || cfg.StartRetry > maxStartRetry {
		return usageError{fmt.Errorf("--start-retry %v: want 0 (no retry) up to %s", cfg.StartRetry, human(maxStartRetry))}
	}
	hosts, err := consoleHosts(cfg)
	if err != nil {
		return err
	}
	log := a.logger()
	w, err := a.wiring()
	if err != nil {
		return err
	}
	// Traces go to an OTLP endpoint when the OTEL_* environment names one
	// (otel.go); flushed last, after the dispatcher stopped.
	shutdownTracing, tracingOn, err := setUpTracing(ctx, a.getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if serr := shutdownTracing(sctx); serr != nil {
			log.Warn("run: flushing traces", slog.Any("error", serr))
		}
	}()
	if tracingOn {
		log.Info("run: exporting traces over OTLP")
	}
	// Rebuilds of this binary's inline projections, requested from any
	// binary (`rebuild NAME`) or interrupted elsewhere, are carried out here,
	// even in a binary that has nothing else to run.
	inline := rebuildableInline(w)
	pool, store, err := a.openForRun(ctx, w, cfg.StartRetry, log) // run_start.go
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(newLogSizeCollector(store))             // streams.go
	async, sagas, err := a.sagaConsumers(store, w, log, reg) // run_saga.go
	if errors.Is(err, postgres.ErrNoMasterKey) {
		return usageError{err} // a saga's state declares personal fields: as for event types
	}
	if err != nil {
		return err
	}
	if len(async) == 0 && len(inline) == 0 {
		return errNothingToRun
	}
	var ui http.Handler
	var tail *live.Feed
	if cfg.HTTPAddr != "" && !cfg.NoConsole {
		// The console's live tail: a live feed whose per-instance consumer
		// this dispatcher runs beside the application's, envelopes only.
		if tail, err = live.New(live.Config{Store: store, Name: consoleTailName, Authorize: console.TailTenant, Logger: log,
			AllowedHosts: hosts}); err != nil {
			return fmt.Errorf("console live tail: %w", err)
		}
		defer tail.Close()
		var consumers []console.ParkedConsumer // their parks on the console's JetStream parked page
		if a.cfg.JetStreamConsumers != nil {
			built, err := a.cfg.JetStreamConsumers(store)
			if err != nil {
				return fmt.Errorf("build the JetStream consumers for the console: %w", err)
			}
			for _, jc := range built {
				consumers = append(consumers, ConsoleParks(jc)) // a nil one: console.New refuses it
			}
		}
		c, err := console.New(console.Config{Store: store, Token: a.getenv(console.EnvToken), ShowPayloads: cfg.ConsolePayloads,
			Projections: async, Sagas: sagas.names, SagaPersonal: sagas.personal, Tail: tail, Logger: log, AllowedHosts: hosts, JetStreamConsumers: consumers})
		if err != nil {
			// err starts "console: invalid configuration": say it once.
			return usageError{fmt.Errorf("%w; $%s holds the token", err, console.EnvToken)}
		}
		ui = c
		async = append(async, tail.Projection())
	}

	d, err := newRunDispatcher(store, async, cfg, log, reg)
	if err != nil {
		return err
	}

	var running atomic.Bool
	var srv *http.Server
	addr := ""
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return usageError{fmt.Errorf("--http-addr: %w", err)}
		}
		addr = ln.Addr().String()
		// On loopback the probes and metrics check the Host header as the
		// console does: a page on any site could otherwise read them
		// through DNS rebinding. Elsewhere they answer any Host, for the
		// scrapers and probes that name the process as they like, as any
		// client on that network could.
		uiHosts, err := hostcheck.New(hosts)
		if err != nil {
			_ = ln.Close()
			return usageError{fmt.Errorf("--console-allowed-hosts: %w", err)}
		}
		var probeHosts *hostcheck.Checker
		if tcp, ok := ln.Addr().(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
			probeHosts = uiHosts
		}
		// IdleTimeout and ReadTimeout bound what an idle or slow client
		// holds (the live tail's streams are responses, which ReadTimeout
		// does not cut, and end with Shutdown).
		srv = &http.Server{Handler: a.routes(reg, &running, pool.Ping, ui, probeHosts, uiHosts),
			ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
		if tail != nil {
			srv.RegisterOnShutdown(tail.Close) // ends the tail's streams, which Shutdown would wait for
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("run: http server", slog.Any("error", err))
			}
		}()
	}
	if err := d.Start(ctx); err != nil {
		if srv != nil {
			_ = srv.Close()
		}
		return err
	}
	if err := sagas.Start(ctx); err != nil {
		_ = d.Stop(context.WithoutCancel(ctx))
		if srv != nil {
			_ = srv.Close()
		}
		return err
	}
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	var serving sync.WaitGroup
	serving.Go(func() { rebuild.ServeInline(serveCtx, store, inline, rebuild.InlineOptions{}, log, 0) })
	running.Store(true)
	if d.d != nil {
		fmt.Fprintf(a.out, "%s run: dispatching %d consumers as instance %s", a.cfg.Name, len(async), projector.Printable(d.d.InstanceID()))
	} else {
		fmt.Fprintf(a.out, "%s run: no async consumers to dispatch", a.cfg.Name)
	}
	if len(inline) > 0 {
		fmt.Fprintf(a.out, "; serving rebuilds of %d inline projections", len(inline))
	}
	if addr != "" {
		fmt.Fprintf(a.out, "; metrics on http://%s/metrics", addr)
		if ui != nil {
			fmt.Fprintf(a.out, ", console on http://%s/console/", addr)
		}
	}
	fmt.Fprintln(a.out)

	started = true
	<-ctx.Done()
	running.Store(false)
	fmt.Fprintf(a.out, "%s run: stopping\n", a.cfg.Name)
	stopServing()
	serving.Wait() // an inline rebuild stops at once, resumable from its cursor
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(cfg.StopTimeout, 30*time.Second))
	defer cancel()
	stopErr := errors.Join(sagas.Stop(stopCtx), d.Stop(stopCtx))
	if srv != nil {
		_ = srv.Shutdown(stopCtx)
	}
	if stopErr != nil {
		return stopErr
	}
	fmt.Fprintf(a.out, "%s run: stopped\n", a.cfg.Name)
	return nil
}

// consoleHosts is the console's AllowedHosts: --console-allowed-hosts and
// the host of --http-addr when it is a name (addresses and localhost
// names are accepted anyway).
func consoleHosts(cfg runConfig) ([]string, error) {
	if _, err := hostcheck.New(cfg.ConsoleAllowedHosts); err != nil {
		return nil, usageError{fmt.Errorf("--console-allowed-hosts: %w", err)}
	}
	hosts := slices.Clone(cfg.ConsoleAllowedHosts)
	if host, _, err := net.SplitHostPort(cfg.HTTPAddr); err == nil && host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			hosts = append(hosts, host)
		}
	}
	if _, err := hostcheck.New(hosts); err != nil {
		return nil, usageError{fmt.Errorf("--http-addr: %w", err)}
	}
	return hosts, nil
}

// routes serves the metrics and probes, and the console at /console/ (with
// / redirecting to it) when ui is not nil. With hosts set, the metrics and
// probes answer only requests whose Host it allows (the console checks its
// own).
func (a *App) routes(reg *prometheus.Registry, running *atomic.Bool, ping func(context.Context) error, ui http.Handler, hosts, uiHosts *hostcheck.Checker) http.Handler {
	mux := http.NewServeMux()
	if ui != nil {
		mux.Handle("/console/", http.StripPrefix("/console", ui))
		// The redirect to the console checks the Host as the console does:
		// "421 on every route" (it answered any Host with a 302).
		redirect := http.RedirectHandler("/console/", http.StatusFound)
		mux.Handle("GET /{$}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if uiHosts != nil && !uiHosts.Allowed(r) {
				hostcheck.Refuse(w, "run")
				return
			}
			redirect.ServeHTTP(w, r)
		}))
	}
	checked := func(pattern string, h http.Handler) {
		mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hosts != nil && !hosts.Allowed(r) {
				hostcheck.Refuse(w, "run")
				return
			}
			h.ServeHTTP(w, r)
		}))
	}
	checked("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	checked("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	}))
	checked("GET /readyz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !running.Load() {
			http.Error(w, "dispatcher not running", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ping(ctx); err != nil {
			http.Error(w, "database unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	}))
	return mux
}

// errNothingToRun is `run` in a binary wired with nothing it could run.
var errNothingToRun = errors.New("this binary has no async projections, sagas or inline projections with declared tables to run (cli.Config.Wire returned none); " +
	"mount the CLI in your application's binary with its projections (docs/operations.md), or set PROJECTOR_EXAMPLE=1 to run the example application")

// rebuildableInline returns the wired inline projections whose rebuilds
// `run` carries out: those that declare their tables (a rebuild of one that
// does not is refused when it is requested).
func rebuildableInline(w Wiring) []*projection.Inline {
	var inline []*projection.Inline
	for _, x := range w.Inline {
		if p, ok := x.(*projection.Inline); ok && len(p.Tables()) > 0 {
			inline = append(inline, p)
		}
	}
	return inline
}

// runDispatcher is the dispatcher `run` starts, or none in a binary whose
// only work is its inline projections' rebuilds: a dispatcher needs
// projections, and that binary still has rebuilds to serve.
type runDispatcher struct{ d *projection.Dispatcher }

func newRunDispatcher(store *postgres.Store, async []*projection.Async, cfg runConfig, log *slog.Logger, reg prometheus.Registerer) (runDispatcher, error) {
	if len(async) == 0 {
		return runDispatcher{}, nil
	}
	d, err := projection.New(projection.Config{Store: store, Projections: async, InstanceID: cfg.InstanceID, Logger: log, Registerer: reg,
		InstanceExpiry: cfg.InstanceExpiry})
	return runDispatcher{d}, err
}

func (r runDispatcher) Start(ctx context.Context) error {
	if r.d == nil {
		return nil
	}
	return r.d.Start(ctx)
}

func (r runDispatcher) Stop(ctx context.Context) error {
	if r.d == nil {
		return nil
	}
	return r.d.Stop(ctx)
}
