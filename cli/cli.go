// Package cli is Projector's ops command line as a library: it returns the
// command tree for a given registry, so an application can mount the same
// commands in its own binary with its own event types and projections
// compiled in. cmd/projector is this package's main with the example
// application registered.
//
// Every command takes --database-url (or PROJECTOR_DATABASE_URL) and
// --schema (or PROJECTOR_SCHEMA). Exit codes are documented on [Main].
package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	neturl "net/url"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// Exit codes of [Main].
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitError: the command failed (database unreachable, query failed).
	ExitError = 1
	// ExitUsage: the command line was wrong (unknown flag, missing argument,
	// bad value).
	ExitUsage = 2
	// ExitRefused: the operation is not allowed in the current state (a
	// guarded transition) and nothing changed.
	ExitRefused = 3
)

// Environment variables read by every command.
const (
	EnvDatabaseURL = "PROJECTOR_DATABASE_URL"
	EnvSchema      = "PROJECTOR_SCHEMA"
)

// Config is what an application hands the command tree.
type Config struct {
	// Name is the binary's name in help texts; default "projector".
	Name string
	// Version is printed by `version`; default the module version the
	// binary was built from.
	Version string
	// Registry holds the application's event types; required by commands
	// that decode events.
	Registry *projector.Registry
	// Wire builds the application's projections for a store on schema: the
	// inline projections every append runs, the async projections `run`
	// dispatches, the stream types `events prune` may delete by default, and
	// a setup step for the application's own tables. Nil means none.
	Wire func(schema string) (Wiring, error)
	// TenantRole and StrictTenancy are the store's
	// [postgres.Config.TenantRole] and [postgres.Config.StrictTenancy]:
	// the role `run`'s tenant-scoped transactions (handlers of tenants'
	// events) switch to, so row-level security isolates them when the
	// binary connects as an owner or superuser, and whether to refuse to
	// start without that isolation (docs/tenancy.md).
	TenantRole    string
	StrictTenancy bool
	// Logger receives log lines of long-running commands; default a text
	// logger on standard error.
	Logger *slog.Logger
	// Commands are extra subcommands to mount (the example binary adds
	// `demo`): the application's own commands beside Projector's. A name
	// or alias one of Projector's commands (or cobra's help and
	// completion) already has is refused: [Main] and [Run] exit
	// [ExitUsage] saying so, and [New] panics.
	Commands []*cobra.Command
	// JetStreamConsumers builds the JetStream claims consumers a consumer
	// service runs, on the store its commands opened: `relay dead-letters
	// retry` needs a consumer's handler to run a dead letter again, so only
	// a binary that wires its consumers here can retry. Nil means none
	// (list, show and discard work without it).
	JetStreamConsumers func(store *postgres.Store) ([]*jetstream.Consumer, error)
	// Getenv looks up the environment variables the commands read
	// (PROJECTOR_*, NATS_URL, OTEL_*, USER); default os.Getenv. A test runs
	// the command tree in its own process with an environment of its own
	// through it, which os.Setenv cannot give tests running in parallel.
	Getenv func(string) string
}

// Wiring is an application's projections, as [Config.Wire] returns them.
type Wiring struct {
	Inline    []postgres.InlineProjection
	Async     []*projection.Async
	Ephemeral []string
	// Setup creates or updates the application's read-model tables; `run`
	// calls it before starting the dispatcher.
	Setup func(ctx context.Context, db postgres.DBTX) error
	// Sagas builds the application's sagas on the store `run` opened (a
	// saga's commands need repositories on it): `run` dispatches each
	// saga's consumer beside Async and fires their timeouts with a
	// saga.Runner. Nil means none.
	Sagas func(store *postgres.Store) ([]saga.Definition, error)
}

// App is the state shared by the commands of one invocation.
type App struct {
	cfg         Config
	databaseURL string
	schema      string
	out, errOut io.Writer
	wired       *Wiring
	// appName is the application_name of the command's connections.
	appName string
	// appends is set by the commands that append events (run): only they
	// let the store note an inline projection this binary does not run.
	appends bool
}

// New returns the root command with every subcommand mounted. It panics
// when one of cfg.Commands is named as a command of the tree ([Run] and
// [Main] report that as a bad command line instead).
func New(cfg Config) *cobra.Command {
	root, err := newRoot(cfg)
	if err != nil {
		panic(err)
	}
	return root
}

// newRoot is [New], returning a clash of cfg.Commands with the tree's own
// commands as an error.
func newRoot(cfg Config) (*cobra.Command, error) {
	cfg.Name = cmp.Or(cfg.Name, "projector")
	if cfg.Registry == nil {
		cfg.Registry = projector.NewRegistry()
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	app := &App{cfg: cfg}
	root := &cobra.Command{
		Use:   cfg.Name,
		Short: "Projections and read models for event-sourced Go applications on PostgreSQL",
		Long: cfg.Name + ` runs Projector's dispatcher and lets operators inspect and steer it.

Every command connects with --database-url (default $` + EnvDatabaseURL + `) and
works on the schema --schema (default $` + EnvSchema + ` or "projector").

Exit codes: 0 success, 1 failure, 2 bad command line, 3 refused (the operation
is not allowed in the current state; nothing changed).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			app.out, app.errOut = cmd.OutOrStdout(), cmd.ErrOrStderr()
			app.appName = ApplicationName(cfg.Name, strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()))
			app.databaseURL = cmp.Or(app.databaseURL, app.getenv(EnvDatabaseURL))
			app.schema = cmp.Or(app.schema, app.getenv(EnvSchema), postgres.DefaultSchema)
			if err := postgres.ValidateSchema(app.schema); err != nil {
				return usageError{fmt.Errorf("--schema: %w", err)}
			}
			return nil
		},
	}
	// Defaults come from the environment at run time, not into the flag
	// defaults, so --help never prints a URL with its password.
	root.PersistentFlags().StringVar(&app.databaseURL, "database-url", "", "PostgreSQL URL (default $"+EnvDatabaseURL+")")
	root.PersistentFlags().StringVar(&app.schema, "schema", "", "schema holding Projector's tables (default $"+EnvSchema+" or projector)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(app.versionCmd(), app.migrateCmd(), app.statusCmd(), app.consumerCmd(), app.eventsCmd(), app.runCmd(), app.repairCmd(), app.rebuildCmd())
	root.AddCommand(app.sagaCmd())
	root.AddCommand(app.searchCmd())
	root.AddCommand(app.relayCmd())
	root.AddCommand(app.deadLettersCmd(), app.parkedCmd(), app.horizonCmd(), app.subjectsCmd(), app.streamsCmd())
	root.AddCommand(app.benchCmd())
	if err := commandsClash(root, cfg.Commands); err != nil {
		return nil, err
	}
	root.AddCommand(cfg.Commands...)
	return root, nil
}

// commandsClash reports an application command named (or aliased) as one
// of the tree's own, or as cobra's help and completion: cobra would mount
// both and run one of them for the name, silently — an application's
// `search` hid `search verify` so, and printed its own output with exit 0.
func commandsClash(root *cobra.Command, extra []*cobra.Command) error {
	taken := map[string]bool{"help": true, "completion": true}
	for _, c := range root.Commands() {
		taken[c.Name()] = true
		for _, a := range c.Aliases {
			taken[a] = true
		}
	}
	for _, c := range extra {
		for _, name := range append([]string{c.Name()}, c.Aliases...) {
			if taken[name] {
				return fmt.Errorf("cli.Config.Commands: %q is already a command of the tree (%s); give yours another name", name, strings.Join(slices.Sorted(maps.Keys(taken)), ", "))
			}
			taken[name] = true
		}
	}
	return nil
}

// Main runs the command tree on os.Args with a context cancelled by SIGINT
// or SIGTERM, prints a failure as one line on standard error and returns
// the exit code: [ExitOK], [ExitError], [ExitUsage] or [ExitRefused].
func Main(cfg Config) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, cfg, os.Args[1:], nil, nil)
}

// Run is [Main] without the process: it runs the command tree on args with
// ctx, writes to stdout and stderr (nil: the process's own) and returns the
// exit code, printing a failure as [Main] does. Tests call it to run many
// command lines in one process, each with its own output and, through
// [Config.Getenv], its own environment; signals are the caller's to wire.
func Run(ctx context.Context, cfg Config, args []string, stdout, stderr io.Writer) int {
	root, err := newRoot(cfg)
	if err != nil {
		fmt.Fprintf(cmp.Or[io.Writer](stderr, os.Stderr), "%s: %v\n", cmp.Or(cfg.Name, "projector"), err)
		return ExitUsage
	}
	// Left unset, cobra's own defaults apply: usage text it prints itself
	// goes to standard error unless an output was set.
	if stdout != nil {
		root.SetOut(stdout)
	}
	if stderr != nil {
		root.SetErr(stderr)
	}
	root.SetArgs(args)
	err = root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	msg := message(err)
	if postgres.IsInsufficientPrivilege(err) && !strings.Contains(msg, "Roles and privileges") {
		msg += `; the database role this command connects as lacks a privilege it needs: a command that changes state needs ` +
			`the application role's privileges, not a read-only operator's (docs/operations.md, "Roles and privileges")`
	}
	fmt.Fprintf(root.ErrOrStderr(), "%s: %s\n", root.Name(), terminalLine(msg))
	return ExitCode(err)
}

// message is err on one line without the "projector: " our sentinels
// start with (errors.New("projector: not found")): Main prints the binary's
// name first, and a sentinel, bare or wrapped mid-message, would otherwise
// repeat it: "projector: import: projector: invalid history file". Each
// error in err's tree, outermost first, whose text starts with the prefix
// has its text replaced by the text without it, so only what an error of
// ours contributed loses the prefix, never a name or value quoted in it.
// The sentinels keep their text: errors.Is and library callers see them
// as before.
func message(err error) string {
	s := err.Error()
	var strip func(error)
	strip = func(e error) {
		if e == nil {
			return
		}
		if m := e.Error(); strings.HasPrefix(m, sentinelPrefix) {
			s = strings.ReplaceAll(s, m, strings.TrimPrefix(m, sentinelPrefix))
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			strip(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				strip(inner)
			}
		}
	}
	strip(err)
	return strings.TrimPrefix(oneLineText(s), sentinelPrefix)
}

// sentinelPrefix starts the text of the module's sentinel errors.
const sentinelPrefix = "projector: "

// ExitCode maps an error from a command to its exit code.
func ExitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, syscall.EADDRINUSE):
		// A port someone else holds is the machine's state, not a bad
		// command line, even when reported against --http-addr.
		return ExitError
	case errors.As(err, &ue) || isCobraUsage(err):
		return ExitUsage
	case errors.Is(err, projector.ErrInvalidTransition):
		return ExitRefused
	default:
		return ExitError
	}
}

// Usage marks err as a bad command line, so [ExitCode] maps it to
// [ExitUsage]: for the flag checks of commands an application mounts
// through [Config.Commands].
func Usage(err error) error { return usageError{err} }

// usageError marks a bad command line.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// isCobraUsage recognises the usage errors cobra returns untyped: an
// unknown subcommand, a missing required flag, and a wrong count of
// arguments from its own checks (cobra.ExactArgs, MaximumNArgs,
// MinimumNArgs, RangeArgs), which a command tree mounted through
// [Config.Commands] may use too.
func isCobraUsage(err error) bool {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "unknown command "), strings.HasPrefix(msg, "required flag(s) "):
		return true
	case strings.HasPrefix(msg, "accepts "), strings.HasPrefix(msg, "requires at least "):
		return strings.Contains(msg, " arg(s)")
	}
	return false
}

// getenv looks up an environment variable through [Config.Getenv].
func (a *App) getenv(key string) string { return a.cfg.Getenv(key) }

// connectTimeout bounds how long a command waits for an unreachable
// database before it gives up with an error, so scripts never hang.
const connectTimeout = 10 * time.Second

// Pool connects to the configured database and checks it answers.
func (a *App) Pool(ctx context.Context) (*pgxpool.Pool, error) {
	if a.databaseURL == "" {
		return nil, usageError{fmt.Errorf("no database: pass --database-url or set %s", EnvDatabaseURL)}
	}
	return connect(ctx, a.databaseURL, cmp.Or(a.appName, ApplicationName(a.cfg.Name, "")))
}

// ApplicationName is the application_name the command tree's connections
// carry, so that pg_stat_activity (and the horizon line) tell Projector's
// own sessions from the application's: "projector" and the subcommand
// ("projector run", "projector rebuild"), with the binary's name after it
// when it is not projector ("projector run (billing-ops)"). PostgreSQL keeps
// 63 printable ASCII bytes of it.
func ApplicationName(binary, command string) string {
	name := strings.TrimSpace("projector " + strings.TrimSpace(command))
	if binary != "" && binary != "projector" {
		name += " (" + binary + ")"
	}
	name = strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, name)
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// IsProjectorApplication reports whether an application_name is one the
// command tree's connections carry ([ApplicationName]): the session is
// Projector's own work (a dispatcher pass, a rebuild's batch).
func IsProjectorApplication(name string) bool {
	return name == "projector" || strings.HasPrefix(name, "projector ")
}

// Connect opens a pool on url and pings it within a bounded time.
//
// No error it returns holds any part of the URL's password, whatever the
// URL looks like: a URL whose user info has an unescaped '@' (which the
// driver would split at the wrong place, taking part of the password for
// the host) is refused as a usage error without being echoed, the database
// is described by host and port only, and the driver's own messages are
// scrubbed of the password. A server that answers but refuses (no such
// database, no such role, wrong password) is told apart from one that does
// not answer, so the message says what to fix.
//
// Its connections carry the application_name "projector" unless url sets
// one.
func Connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return connect(ctx, url, ApplicationName("", ""))
}

// connect is Connect with the application_name to set when url sets none.
func connect(ctx context.Context, url, appName string) (*pgxpool.Pool, error) {
	secrets, err := urlSecrets(url)
	if err != nil {
		return nil, usageError{fmt.Errorf("database url: %w", err)}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usageError{scrub(fmt.Errorf("database url: %w", hidePasswordString(url, err)), secrets)}
	}
	if p := cfg.ConnConfig.Password; p != "" {
		secrets = append(secrets, p)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" && appName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > connectTimeout {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, scrub(fmt.Errorf("connect to %s: %w", describe(cfg), err), secrets)
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, scrub(connectError(cfg, err), secrets)
	}
	return pool, nil
}

// connectError says why a ping failed: the server refused us (and what to
// do about it) or it did not answer at all.
func connectError(cfg *pgxpool.Config, err error) error {
	where := describe(cfg)
	db := cfg.ConnConfig.Database
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		var msg string
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			msg = fmt.Sprintf("database %q does not exist on the server at %s: create it (createdb %s) or name another in --database-url or $%s",
				db, where, db, EnvDatabaseURL)
		case "28000": // invalid_authorization_specification: no such role, or pg_hba.conf
			msg = fmt.Sprintf("the server at %s refused the login: %s: check the user in --database-url or $%s (the role must exist with LOGIN, and pg_hba.conf must let it in)",
				where, pgErr.Message, EnvDatabaseURL)
		case "28P01": // invalid_password
			msg = fmt.Sprintf("the server at %s refused the login: %s: check the password in --database-url or $%s (it is never printed)",
				where, pgErr.Message, EnvDatabaseURL)
		default:
			msg = fmt.Sprintf("the server at %s refused the connection: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
		}
		return &hiddenError{msg: msg, err: err}
	}
	// The driver's connect error starts with "failed to connect to
	// `user=… database=…`"; the cause after it is what the operator needs.
	cause := err
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		cause = ce.Unwrap()
	}
	// It repeats the same line for every address and fallback it tried.
	var lines []string
	for _, l := range strings.Split(cause.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return &hiddenError{msg: fmt.Sprintf("cannot reach database at %s: %s", where, strings.Join(lines, "; ")), err: err}
}

// describe names a database by host and port only: never the user, and
// never anything a mis-split URL may have put into the host from the
// password.
func describe(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	host := c.Host
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		host = host[i+1:]
	}
	return fmt.Sprintf("%s:%d", host, c.Port)
}

// urlSecrets returns the password a database URL or key=value connection
// string holds, in every spelling an error might echo, and refuses a URL
// whose user info cannot be split without guessing.
func urlSecrets(raw string) ([]string, error) {
	var secrets []string
	add := func(s string) {
		if s == "" {
			return
		}
		secrets = append(secrets, s)
		if u, err := neturl.PathUnescape(s); err == nil && u != s {
			secrets = append(secrets, u)
		}
	}
	if rest, ok := cutScheme(raw); ok {
		// The user info ends at the first '@' before any '/', as pgx and
		// libpq read it (net/url takes the last '@' instead).
		userinfo, hostAndRest := "", rest
		if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
			userinfo, hostAndRest = rest[:i], rest[i+1:]
		}
		hostAndPath, query, _ := strings.Cut(hostAndRest, "?")
		if strings.Contains(hostAndPath, "@") {
			// Another '@': the password holds an unescaped '@' or '/', and
			// the driver would take part of it for the host and print it.
			return nil, errors.New("the user info holds an unescaped '@' or '/' (the URL is not printed): percent-encode them as %40 and %2F")
		}
		if _, pw, ok := strings.Cut(userinfo, ":"); ok {
			add(pw)
		}
		if q, err := neturl.ParseQuery(query); err == nil {
			add(q.Get("password"))
			add(q.Get("sslpassword"))
		}
		return secrets, nil
	}
	for _, m := range keywordPassword.FindAllStringSubmatch(raw, -1) {
		add(m[1]) // quoted, as written
		add(strings.NewReplacer(`\'`, "'", `\\`, `\`).Replace(m[1]))
		add(m[2]) // unquoted
	}
	return secrets, nil
}

// hidePasswordString keeps a keyword/value connection string that names a
// password out of its parse error: pgx prints the string with the password
// redacted as best it can, and a value with an escaped blank or an
// unterminated quote leaves part of it (password=xxxxx Secret). The error
// keeps pgx's reason, the text after the string.
func hidePasswordString(url string, err error) error {
	var pe *pgconn.ParseConfigError
	if _, isURL := cutScheme(url); isURL || !strings.Contains(strings.ToLower(url), "password") || !errors.As(err, &pe) {
		return err
	}
	reason := "not a keyword/value connection string"
	if msg := pe.Error(); strings.HasPrefix(msg, "cannot parse `") {
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			reason = msg[i+len("`: "):]
		}
	}
	return &hiddenError{msg: "cannot parse the keyword/value connection string (not shown: it names a password): " + reason, err: err}
}

// keywordPassword finds password=… in a key=value connection string, quoted
// (with backslash escapes) or not.
var keywordPassword = regexp.MustCompile(`(?i)\bpassword\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))`)

func cutScheme(raw string) (string, bool) {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if len(raw) >= len(scheme) && strings.EqualFold(raw[:len(scheme)], scheme) {
			return raw[len(scheme):], true
		}
	}
	return "", false
}

// scrub hides every secret in err's text, keeping err for errors.Is and
// errors.As.
func scrub(err error, secrets []string) error {
	msg := err.Error()
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return &hiddenError{msg: msg, err: err}
}

// hiddenError shows msg in place of err's own text.
type hiddenError struct {
	msg string
	err error
}

func (h *hiddenError) Error() string { return h.msg }
func (h *hiddenError) Unwrap() error { return h.err }

// Store opens the event store on the configured schema, with the
// application's inline projections and ephemeral stream types. Outside
// `run` the store keeps quiet about an inline projection recorded in the
// schema that this binary does not run: the other commands do not append,
// so the note would only be noise on every one of them.
func (a *App) Store(ctx context.Context, pool *pgxpool.Pool) (*postgres.Store, error) {
	w, err := a.wiring()
	if err != nil {
		return nil, err
	}
	master, old, err := masterKeysFromEnv(a.getenv)
	if err != nil {
		return nil, err
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: a.schema, Registry: a.cfg.Registry, Logger: a.logger(),
		Inline: w.Inline, Ephemeral: w.Ephemeral, QuietInlineNote: !a.appends, MasterKey: master, OldMasterKeys: old,
		TenantRole: a.cfg.TenantRole, StrictTenancy: a.cfg.StrictTenancy,
		// Only `run` must seal and open personal fields to work at all: the
		// inspecting commands and `subjects forget` run without a master key.
		AllowNoMasterKey: !a.appends})
	if errors.Is(err, postgres.ErrNoMasterKey) {
		return nil, usageError{err} // the environment lacks PROJECTOR_MASTER_KEY
	}
	return store, err
}

// masterKeysFromEnv reads PROJECTOR_MASTER_KEY and PROJECTOR_OLD_MASTER_KEYS:
// a malformed value is a bad command line (exit 2), and the error never
// holds key material.
func masterKeysFromEnv(getenv func(string) string) (*postgres.MasterKey, []*postgres.MasterKey, error) {
	var master *postgres.MasterKey
	if v := getenv(postgres.MasterKeyEnv); v != "" {
		var err error
		if master, err = postgres.ParseMasterKey(v); err != nil {
			return nil, nil, usageError{fmt.Errorf("%s: %w", postgres.MasterKeyEnv, err)}
		}
	}
	var old []*postgres.MasterKey
	if v := getenv(postgres.OldMasterKeysEnv); v != "" {
		var err error
		if old, err = postgres.ParseMasterKeys(v); err != nil {
			return nil, nil, usageError{fmt.Errorf("%s: %w", postgres.OldMasterKeysEnv, err)}
		}
		if master == nil {
			return nil, nil, usageError{fmt.Errorf("%s is set but %s is not: the old keys' data keys need a master key to be rewrapped under",
				postgres.OldMasterKeysEnv, postgres.MasterKeyEnv)}
		}
		for _, m := range old {
			if m.ID() == master.ID() {
				return nil, nil, usageError{fmt.Errorf("%s lists master key %q, the id of %s: an old key needs an id of its own",
					postgres.OldMasterKeysEnv, m.ID(), postgres.MasterKeyEnv)}
			}
		}
	}
	return master, old, nil
}

// wiring calls Config.Wire once per invocation.
func (a *App) wiring() (Wiring, error) {
	if a.wired != nil {
		return *a.wired, nil
	}
	var w Wiring
	if a.cfg.Wire != nil {
		var err error
		if w, err = a.cfg.Wire(a.schema); err != nil {
			return Wiring{}, fmt.Errorf("wire projections: %w", err)
		}
	}
	a.wired = &w
	return w, nil
}

func (a *App) logger() *slog.Logger {
	if a.cfg.Logger != nil {
		return a.cfg.Logger
	}
	return slog.New(slog.NewTextHandler(cmp.Or[io.Writer](a.errOut, os.Stderr), nil))
}

func (a *App) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := a.cfg.Version
			if v == "" {
				v = "(devel)"
				if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
					v = bi.Main.Version
				}
			}
			fmt.Fprintf(a.out, "%s %s\n", a.cfg.Name, v)
			return nil
		},
	}
}

// group returns a parent command. It is runnable so that an unknown
// subcommand is a usage error (exit 2): for arguments to a parent that is
// not, cobra shows help and exits 0.
func group(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return cmd.Help()
		},
	}
}

// noArgs is cobra.NoArgs with the usage exit code.
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return usageError{err}
	}
	return nil
}
