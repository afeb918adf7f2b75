// Package clientcheck makes a transaction's backend notice a client that
// died while one of its statements runs.
//
// PostgreSQL notices a dead client (SIGKILL, a lost host) only when it next
// reads from it: a backend whose statement waits for a lock lives on until
// the wait ends, keeping every lock its transaction holds — a dispatcher
// shard's advisory lock, a JetStream claim and its stream's row, a saga's
// claimed timeouts — so no other process can take that work over for as
// long as the other transaction runs. With client_connection_check_interval
// set for the transaction, the backend polls its socket every second while
// a statement runs and ends about a second after its client.
package clientcheck

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQL sets client_connection_check_interval to one second for the current
// transaction. Send it in the same round trip as the transaction's first
// statement (a pgx.Batch) where the server supports it ([Supported]): it
// costs the server a function call and no round trip.
const SQL = `SELECT set_config('client_connection_check_interval', '1s', true)`

// Supported reports whether the server behind conn knows
// client_connection_check_interval (PostgreSQL 14 and later; earlier ones
// refuse the name, which would abort the transaction).
func Supported(conn *pgconn.PgConn) bool {
	return ServerMajor(conn.ParameterStatus("server_version")) >= 14
}

// ServerMajor reads the major version from a server_version such as
// "15.20 (Debian 15.20-0+deb12u1)" or "17beta1"; 0 when it cannot.
func ServerMajor(v string) int {
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
