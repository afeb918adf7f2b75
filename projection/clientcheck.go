package projection

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// clientCheckSQL makes a pass's backend check, every second while a
// statement runs, that its client is still connected, for the pass's
// transaction only. A backend notices a client that died (SIGKILL, a lost
// host) only when it next reads from it: one whose handler statement waits
// for a lock would otherwise live on until the wait ends, keeping the
// shard's lock, so the partitions of a dead process could not be taken
// over, nor a consumer's shard locked by an operator, for as long as the
// other transaction runs. With the check the backend ends within about a
// second of its client. The check is a poll of the socket: it costs
// nothing a pass can measure.
const clientCheckSQL = `SELECT set_config('client_connection_check_interval', '1s', true)`

// checksClient reports whether the server behind conn knows
// client_connection_check_interval (PostgreSQL 14 and later; earlier ones
// refuse the name).
func checksClient(conn *pgconn.PgConn) bool {
	return serverMajor(conn.ParameterStatus("server_version")) >= 14
}

// serverMajor reads the major version from a server_version such as
// "15.20 (Debian 15.20-0+deb12u1)" or "17beta1"; 0 when it cannot.
func serverMajor(v string) int {
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, err := strconv.Atoi(v[:end])
	if err != nil {
		return 0
	}
	return n
}
