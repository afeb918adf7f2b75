package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/migrations"
)

// DefaultSchema is the schema Projector's tables live in unless configured.
const DefaultSchema = "projector"

// TenantSetting is the transaction-local setting that holds the tenant of a
// tenant-scoped transaction. Row-level-security policies compare against it:
//
//	USING (tenant_id = current_setting('projector.tenant_id', true))
const TenantSetting = "projector.tenant_id"

// ErrRestoredDatabase means the events table holds transaction ids from the
// future of this server: the database was restored from a dump into another
// cluster. Reading on would hide new events behind old cursors, so the store
// refuses to start; see docs/operations.md for the repair.
var ErrRestoredDatabase = errors.New("projector: database restored into a different cluster")

// ErrNoTenantIsolation means tenant-scoped transactions would not be
// isolated: no TenantRole is configured and the connecting role is a
// superuser or has BYPASSRLS, so PostgreSQL applies no row-level-security
// policy to it and every tenant sees every row. New returns it only when
// Config.StrictTenancy asks; otherwise it logs a warning.
var ErrNoTenantIsolation = errors.New("projector: tenant scoping would not be enforced")

// ErrTenantRoleInherited means the role the store's sessions run as
// inherits Config.TenantRole (a membership granted WITH INHERIT, the
// default before PostgreSQL 16): the tenant role's row-level-security
// policies would then filter its unscoped work too. New refuses it; grant
// the membership WITH INHERIT FALSE, or make the role NOINHERIT.
var ErrTenantRoleInherited = errors.New("projector: the connecting role inherits the tenant role")

// ErrInvalidConfig means a Config field or an argument the store cannot
// take as given (a role or stream type PostgreSQL cannot store, a negative
// limit, a batch or page size out of range): it is refused before anything
// is sent.
var ErrInvalidConfig = errors.New("projector: invalid store configuration")

// ErrSchemaOutdated means the schema is missing migrations this binary needs.
var ErrSchemaOutdated = errors.New("projector: schema needs migrating")

// DBTX is what reads need: a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB is a DBTX that can also begin a transaction: a pool or a connection.
type DB interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// InlineProjection is applied inside the transaction of every append, after
// the events are inserted, so the events and the read models it writes commit
// together or not at all. The projection package implements it; the store
// declares it so no append can bypass a registered inline projection.
type InlineProjection interface {
	// Name identifies the projection in errors.
	Name() string
	// Validate reports a definition error or a handled event type the
	// registry does not define; New refuses to start with either.
	Validate(reg *projector.Registry) error
	// ApplyInline applies the events one append wrote, in version order.
	// Events carry their decoded Payload. An error aborts the transaction.
	ApplyInline(ctx context.Context, tx pgx.Tx, events []projector.Event) error
}

// Config configures a [Store]. Registry is required; every other field has a
// documented default.
type Config struct {
	// Schema holds Projector's tables; default [DefaultSchema].
	Schema string
	// Registry defines the event types the store may append and decode.
	Registry *projector.Registry
	// TenantRole, when set, is the role tenant-scoped transactions switch to
	// with SET LOCAL ROLE. It must exist, must not be a superuser and must not
	// have BYPASSRLS, so row-level security holds even when the application
	// connects as a superuser or as the tables' owner.
	TenantRole string
	// StrictTenancy makes New refuse, with [ErrNoTenantIsolation], a pool
	// whose role is a superuser or has BYPASSRLS when no TenantRole is set:
	// such a store's tenant-scoped transactions look as if they worked but
	// isolate nothing. Without it New logs a warning instead. Set it in
	// applications that rely on tenancy.
	StrictTenancy bool
	// Inline projections run inside every append's transaction. Those that
	// implement [RecordedInline] (projection.Inline does) are recorded in
	// the schema at New, and from then on any store on the schema that lacks
	// one, or runs an older version of it, is refused appends of the event
	// types it covers ([ErrInlineProjectionRequired]).
	Inline []InlineProjection
	// InlineRefresh is how often the store re-reads the recorded inline
	// projections, in the background; default [DefaultInlineRefresh]. A
	// projection recorded by another process fences this one's appends
	// within about this long.
	InlineRefresh time.Duration
	// QuietInlineNote keeps to itself the start-up note that an inline
	// projection recorded in the schema is not in Inline: set it in a
	// process that only reads (a dashboard, the CLI's inspecting commands),
	// for which the note is noise. Appends it refuses still fail with
	// [ErrInlineProjectionRequired]. Without it the note is logged once per
	// process, schema and projection, however many stores the process opens.
	QuietInlineNote bool
	// Ephemeral lists stream types whose events may be deleted once old
	// (sessions, telemetry): what Prune and `projector events prune` act on
	// when told no stream types. Aggregate streams are history; leave them
	// out.
	Ephemeral []string
	// Logger receives the store's few log lines; default slog.Default().
	Logger *slog.Logger
	// TracerProvider records the append spans; default
	// otel.GetTracerProvider(), which does nothing until the application
	// installs an SDK. An append whose context carries no sampled or
	// recording span starts no span and writes no trace context
	// (docs/tracing.md).
	TracerProvider trace.TracerProvider
	// Keys holds the data subjects' keys for the registry's personal
	// fields; default the [KeyTable] of the store's schema, its keys
	// wrapped by MasterKey.
	Keys KeyStore
	// MasterKey wraps the default key table's data keys; default the key
	// in the PROJECTOR_MASTER_KEY environment variable ([ParseMasterKey]
	// gives the format; New fails on a malformed one). Without either,
	// New fails with [ErrNoMasterKey] when the registry declares personal
	// fields, unless AllowNoMasterKey is set. Ignored when Keys is set.
	MasterKey *MasterKey
	// AllowNoMasterKey lets New open a store without a master key although
	// the registry declares personal fields: for a process that neither
	// appends nor reads them (an ops tool, one that only forgets). Its
	// appends and reads of sealed fields fail with [ErrNoMasterKey] and
	// write nothing; forgetting works.
	AllowNoMasterKey bool
	// OldMasterKeys are master keys the default key table's data keys may
	// still be wrapped by while a rotation is under way: they open those
	// keys (new keys are always wrapped by MasterKey), and
	// [Store.RewrapKeys] rewraps them under MasterKey. Default the keys in
	// the PROJECTOR_OLD_MASTER_KEYS environment variable
	// ([ParseMasterKeys]); New fails on a malformed one, or when old keys
	// come without a master key. Ignored when Keys is set.
	OldMasterKeys []*MasterKey
	// KeyCacheSize bounds the unwrapped data keys the default key table
	// keeps in the process (a least-recently-used cache), which spares an
	// append a round trip for the key; 0 means [DefaultKeyCacheSize], a
	// negative size turns the cache off. A cached key is only ever used
	// after a check in the same statement that its subject was not
	// forgotten (docs/privacy.md, "Keys"). Ignored when Keys is set.
	KeyCacheSize int
}

// Store is the event store: appends, stream reads and the gap-safe global
// log, on one PostgreSQL schema. It is safe for concurrent use.
type Store struct {
	pool      *pgxpool.Pool
	schema    string // validated, unquoted
	registry  *projector.Registry
	role      string
	inline    []InlineProjection
	inlineRec *inlineState // the recorded inline projections as last read
	ephemeral []string
	logger    *slog.Logger
	tracer    trace.Tracer
	sql       statements
	// unisolated, when set, is the warning the first tenant-scoped
	// transaction logs (see checkUnisolated).
	unisolated     func(context.Context)
	unisolatedOnce sync.Once
	// watch holds the in-process watches of appends (WatchAppends).
	watch watchers
	// keys holds the data subjects' keys (personal fields); noMasterKey:
	// the key table has no master key and none was allowed to be missing
	// (CheckMasterKey).
	keys        KeyStore
	noMasterKey bool
}

// New checks the schema and returns a store. It fails with
// [ErrSchemaOutdated] if migrations are pending and with
// [ErrRestoredDatabase] if the stored transaction ids are ahead of the
// server's (a restore into a new cluster).
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres store: nil pool")
	}
	if cfg.Registry == nil {
		return nil, errors.New("postgres store: Config.Registry is required")
	}
	s := &Store{
		pool:     pool,
		schema:   schemaOrDefault(cfg.Schema),
		registry: cfg.Registry,
		role:     cfg.TenantRole,
		logger:   cmp.Or(cfg.Logger, slog.Default()),
	}
	s.tracer = tracing.Tracer(cfg.TracerProvider)
	if err := ValidateSchema(s.schema); err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	if s.role != "" {
		if err := validRole(s.role); err != nil {
			return nil, fmt.Errorf("postgres store: Config.TenantRole: %w", err)
		}
	}
	for _, t := range cfg.Ephemeral {
		if err := projector.Stream(t, "x").Validate(); t == "" || err != nil {
			return nil, fmt.Errorf("%w: Config.Ephemeral: stream type %s is not a storable name (non-empty, valid UTF-8 without NUL, at most %d bytes)",
				ErrInvalidConfig, projector.Quoted(t), projector.MaxNameLength)
		}
	}
	names := map[string]bool{}
	for i, p := range cfg.Inline {
		if p == nil {
			return nil, fmt.Errorf("postgres store: inline projection %d is nil", i)
		}
		if names[p.Name()] {
			return nil, fmt.Errorf("postgres store: inline projection %q registered twice", p.Name())
		}
		names[p.Name()] = true
		if err := p.Validate(cfg.Registry); err != nil {
			return nil, fmt.Errorf("postgres store: %w", err)
		}
	}
	s.inline = append([]InlineProjection(nil), cfg.Inline...)
	s.ephemeral = append([]string(nil), cfg.Ephemeral...)
	s.sql = buildStatements(quoteIdent(s.schema))
	if err := s.setupKeys(cfg); err != nil {
		return nil, err
	}

	if err := s.checkSchema(ctx); err != nil {
		return nil, err
	}
	if err := s.checkRestored(ctx); err != nil {
		return nil, err
	}
	if s.role != "" {
		if err := s.checkTenantRole(ctx); err != nil {
			return nil, err
		}
	} else if err := s.checkUnisolated(ctx, cfg.StrictTenancy); err != nil {
		return nil, err
	}
	if err := s.setupInline(ctx, s.inline, cfg.InlineRefresh, cfg.QuietInlineNote); err != nil {
		return nil, err
	}
	return s, nil
}

// Pool returns the pool the store was built on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Schema returns the schema the store's tables live in.
func (s *Store) Schema() string { return s.schema }

// Registry returns the store's event-type registry.
func (s *Store) Registry() *projector.Registry { return s.registry }

// Table returns the quoted, schema-qualified name of one of Projector's
// tables, such as Table("projector_events"), for packages that keep their
// own state beside the log.
func (s *Store) Table(name string) string { return quoteIdent(s.schema) + "." + quoteIdent(name) }

func (s *Store) checkSchema(ctx context.Context) error {
	all, err := migrations.All()
	if err != nil {
		return err
	}
	status, err := MigrationStatus(ctx, s.pool, s.schema)
	if err != nil {
		return fmt.Errorf("postgres store: %w", err)
	}
	var pending []int
	for _, m := range status {
		if !m.Applied() {
			pending = append(pending, m.Version)
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%w: schema %q lacks migrations %v; run `projector migrate up` or postgres.Migrate", ErrSchemaOutdated, s.schema, pending)
	}
	if len(status) > len(all) {
		s.logger.WarnContext(ctx, "postgres store: schema has migrations newer than this binary; it may be running an older release",
			slog.String("schema", s.schema), slog.Int("known", len(all)), slog.Int("applied", len(status)))
	}
	return nil
}

// checkRestored compares the newest stored transaction id (of an event or a
// consumer position) with the server's next one. On the cluster that wrote
// them, stored ids are always older.
func (s *Store) checkRestored(ctx context.Context) error {
	var maxTx *uint64
	var next uint64
	if err := s.pool.QueryRow(ctx, s.sql.restoredCheck).Scan(&maxTx, &next); err != nil {
		return fmt.Errorf("postgres store: check transaction ids: %w", err)
	}
	if maxTx != nil && *maxTx >= next {
		return fmt.Errorf("%w: schema %q holds log positions of transaction %d but this server's next transaction id is %d; "+
			"new events would sort before old ones and consumers would never see them. "+
			"Run `projector repair restored-cluster` before starting (docs/operations.md, \"Restoring a backup\")",
			ErrRestoredDatabase, s.schema, *maxTx, next)
	}
	return nil
}

func (s *Store) checkTenantRole(ctx context.Context) error {
	var super, bypass bool
	err := s.pool.QueryRow(ctx, `SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1`, s.role).Scan(&super, &bypass)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres store: tenant role %q does not exist (CREATE ROLE %s NOLOGIN; see docs/tenancy.md)", s.role, quoteIdent(s.role))
	}
	if err != nil {
		return fmt.Errorf("postgres store: look up tenant role %q: %w", s.role, err)
	}
	if super || bypass {
		return fmt.Errorf("postgres store: tenant role %q is a superuser or has BYPASSRLS, so row-level security would not apply to it", s.role)
	}
	// The connecting role must not inherit the tenant role: a policy TO
	// the tenant role applies to every role that inherits it, so the
	// policies on the application's read-model tables (written TO the
	// tenant role, as docs/tenancy.md says) would filter the application's
	// own unscoped work too, the system tenant's handlers included. It
	// needs the membership, to switch to the role, without inheritance.
	var connecting string
	var inherits bool
	err = s.pool.QueryRow(ctx, `SELECT current_user, $1::text <> current_user AND NOT r.rolsuper AND NOT r.rolbypassrls
		AND pg_has_role(current_user, $1::text, 'USAGE') FROM pg_roles r WHERE r.rolname = current_user`, s.role).Scan(&connecting, &inherits)
	if err != nil {
		return fmt.Errorf("postgres store: look up the connecting role's membership of tenant role %q: %w", s.role, err)
	}
	if inherits {
		return fmt.Errorf("%w: role %q inherits tenant role %q, so the row-level-security policies written for the tenant role "+
			"apply to its own unscoped work too (a read model's handlers for system-tenant events would see none of its rows); "+
			"grant the membership without inheritance: GRANT %s TO %s WITH INHERIT FALSE (PostgreSQL 16 and later) or "+
			"ALTER ROLE %s NOINHERIT (docs/tenancy.md)", ErrTenantRoleInherited, connecting, s.role,
			quoteIdent(s.role), quoteIdent(connecting), quoteIdent(connecting))
	}
	// A table's owner, and any role with the owner's privileges, bypasses
	// its row-level security: the policies GrantTenantRole writes on
	// Projector's tables would then filter nothing.
	var owned []string
	rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_class c
		WHERE c.relnamespace = $1::regnamespace AND c.relname = ANY($2) AND pg_has_role($3, c.relowner, 'USAGE')
		ORDER BY c.relname`, s.schema, tenantTables, s.role)
	if err == nil {
		owned, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("postgres store: look up the owners of Projector's tables: %w", err)
	}
	if len(owned) > 0 {
		return fmt.Errorf("postgres store: tenant role %q owns (or has the privileges of the owner of) %v in schema %q, "+
			"so row-level security would not apply to it there; use a role that owns nothing (docs/tenancy.md)", s.role, owned, s.schema)
	}
	// An append of personal fields locks its subjects' key rows FOR SHARE
	// (KeyTable.DataKey), which needs an UPDATE privilege that
	// GrantTenantRole grants since this lock came: one granted before fails
	// every tenant-scoped append of them. Said here, at start.
	if _, ok := s.keys.(*KeyTable); ok && s.registry.HasPersonal() {
		var may bool
		if err := s.pool.QueryRow(ctx, `SELECT has_column_privilege($1, $2::regclass, 'tenant_id', 'UPDATE')`,
			s.role, s.Table("projector_subject_keys")).Scan(&may); err != nil {
			return fmt.Errorf("postgres store: look up tenant role %q's privileges: %w", s.role, err)
		}
		if !may {
			return fmt.Errorf("postgres store: tenant role %q may not lock data subjects' keys, which a tenant-scoped append of "+
				"personal fields does (so that a forget waits for it); run postgres.GrantTenantRole for it again (docs/tenancy.md)", s.role)
		}
	}
	return nil
}

// checkUnisolated looks at the role the pool's sessions run as (current_user:
// the role a login drops to, which is what row-level security looks at).
// Without a TenantRole, tenant scoping only sets the tenant setting, and a
// superuser or BYPASSRLS role ignores every policy keyed on it: tenant-scoped
// transactions would look as if they worked and isolate nothing. Strict
// refuses that. Otherwise the warning is logged once, by the first
// transaction scoped to a tenant: many applications have no tenants at all,
// and their logs (and every ops command's stderr) should not carry a warning
// about isolation they never asked for.
func (s *Store) checkUnisolated(ctx context.Context, strict bool) error {
	var user string
	var super, bypass bool
	err := s.pool.QueryRow(ctx, `SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user`).Scan(&user, &super, &bypass)
	if err != nil {
		return fmt.Errorf("postgres store: look up the connecting role: %w", err)
	}
	if !super && !bypass {
		return nil
	}
	if strict {
		return fmt.Errorf("%w: role %q is a superuser or has BYPASSRLS and no TenantRole is configured, so row-level security "+
			"would not apply to tenant-scoped transactions; set Config.TenantRole (docs/tenancy.md)", ErrNoTenantIsolation, user)
	}
	s.unisolated = func(ctx context.Context) {
		s.logger.WarnContext(ctx, "postgres store: tenant-scoped transactions are not isolated: the role is a superuser or has BYPASSRLS "+
			"and no TenantRole is set, so row-level-security policies do not apply (set Config.TenantRole, or StrictTenancy to refuse; docs/tenancy.md)",
			slog.String("role", user), slog.Bool("superuser", super), slog.Bool("bypassrls", bypass))
	}
	return nil
}

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// validRole refuses a role name PostgreSQL cannot take as given: empty,
// not valid UTF-8, holding a NUL (the driver's identifier quoting drops it,
// so "role\x00" would name another role), or longer than an identifier's 63
// bytes (PostgreSQL would truncate it, naming another role again).
func validRole(role string) error {
	if role == "" || len(role) > 63 || projector.ValidText(role) != nil {
		return fmt.Errorf("%w: role %s: want a PostgreSQL role name (1 to 63 bytes of valid UTF-8 without NUL)", ErrInvalidConfig, projector.Quoted(role))
	}
	return nil
}

// ValidateSchema reports whether name is an acceptable schema name: lower
// case letters, digits and underscores, at most 63 bytes, so it never needs
// quoting surprises in hand-written SQL; and not a system schema's
// (information_schema, or pg_ and what follows, which PostgreSQL reserves):
// migrating into information_schema would mix the store's tables into the
// SQL standard's catalog views.
func ValidateSchema(name string) error {
	if !schemaPattern.MatchString(name) {
		return fmt.Errorf("schema name %q: want lower case letters, digits and _ (at most 63, not starting with a digit)", name)
	}
	if name == "information_schema" || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("schema name %q: a system schema's name (information_schema, pg_…): pick a schema of your own", name)
	}
	return nil
}

func schemaOrDefault(s string) string { return cmp.Or(s, DefaultSchema) }

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }
