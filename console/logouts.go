package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Logouts are shared by every console process through
// projector_console_logouts (migration 31): a logout through one process
// ends the session in all of them. Each process also keeps its own
// (endedSessions), which it checks first.

// logoutKey is how a session is named in the table: a SHA-256 of its
// cookie's MAC, so the table holds nothing that helps forge a cookie.
func logoutKey(mac string) string {
	sum := sha256.Sum256([]byte(mac))
	return hex.EncodeToString(sum[:])
}

// recordLogout writes a session's logout for every console process, and
// deletes the logouts of sessions expired since. A role that may not write
// the table (a read-only console role with a token) or a schema before
// migration 31 keeps the logout in this process only, said in a warning.
func (c *Console) recordLogout(ctx context.Context, mac string, exp int64) {
	t := c.cfg.Store.Table("projector_console_logouts")
	_, err := c.cfg.Store.Pool().Exec(ctx, `WITH gone AS (DELETE FROM `+t+` WHERE expires_at < now())
		INSERT INTO `+t+` (session, expires_at) VALUES ($1, to_timestamp($2)) ON CONFLICT (session) DO NOTHING`,
		logoutKey(mac), exp)
	if err != nil {
		c.log.Warn("console: logout recorded in this process only: other console processes accept the session until it expires",
			slog.Any("error", err))
	}
}

// loggedOut reports whether a session was logged out through another
// console process. Asked only of a session this process has not seen
// logged out, with a valid MAC and expiry. A schema before migration 31
// has no shared logouts: false. Any other failure to ask refuses the
// session, for this request.
func (c *Console) loggedOut(ctx context.Context, mac string, exp int64) bool {
	var out bool
	err := c.cfg.Store.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+c.cfg.Store.Table("projector_console_logouts")+` WHERE session = $1)`,
		logoutKey(mac)).Scan(&out)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		if out {
			c.ended.add(mac, exp)
		}
		return out
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table: not migrated yet
		return false
	default:
		c.log.Warn("console: session refused: could not read the shared logouts", slog.Any("error", err))
		return true
	}
}

// sessionTimeout bounds the shared-logout statements, which run in a
// request: a session is refused rather than a page hung.
const sessionTimeout = 5 * time.Second
