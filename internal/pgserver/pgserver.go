// Package pgserver starts a throwaway PostgreSQL cluster from the local
// server binaries (initdb, pg_ctl), for tests and for the demo on a machine
// with PostgreSQL installed but not running.
//
// The cluster lives in a temporary directory, listens only on a Unix socket
// inside it (so it never collides with a server on a TCP port), trusts local
// connections and trades durability for speed (fsync off): it is for data
// nobody needs after Stop.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoBinaries means no initdb/pg_ctl pair was found.
var ErrNoBinaries = errors.New("pgserver: PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin")

// Server is a running throwaway cluster.
type Server struct {
	dir  string
	bin  string
	cred *syscall.Credential
	// URL connects to the cluster's postgres database as the postgres user.
	URL string
}

// FindBinaries returns the directory holding initdb and pg_ctl: from PATH
// first, else the newest Debian-style /usr/lib/postgresql/<version>/bin.
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	slices.SortFunc(matches, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// Start initialises and starts a cluster in a new temporary directory. As
// root, where PostgreSQL refuses to run, it runs the server as the
// "postgres" system user (or "nobody" when there is none). settings are
// extra server settings, "name=value" (max_prepared_transactions=10 for a
// test of two-phase commit, which the shared test server may have off).
func Start(ctx context.Context, settings ...string) (*Server, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "projector-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: temp dir: %w", err)
	}
	s := &Server{dir: dir, bin: bin}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if os.Geteuid() == 0 {
		if s.cred, err = unprivileged(); err != nil {
			return nil, err
		}
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgserver: chown %s: %w", dir, err)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, fmt.Errorf("pgserver: initdb: %w\n%s", err, out)
	}
	opts := strings.Join([]string{
		"-c listen_addresses=''",
		"-k " + dir,
		"-c fsync=off",
		"-c synchronous_commit=off",
		"-c full_page_writes=off",
		"-c max_connections=300",
		"-c shared_buffers=128MB",
	}, " ")
	for _, kv := range settings {
		opts += " -c " + kv
	}
	if out, err := s.run(ctx, "pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return nil, fmt.Errorf("pgserver: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	s.URL = "postgres://postgres@/postgres?host=" + url.QueryEscape(dir) + "&sslmode=disable"
	ok = true
	return s, nil
}

// Dir returns the cluster's directory (data, socket and log).
func (s *Server) Dir() string { return s.dir }

// Stop shuts the cluster down at once and removes its directory.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.run(ctx, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	rmErr := os.RemoveAll(s.dir)
	if err != nil {
		return fmt.Errorf("pgserver: pg_ctl stop: %w\n%s", err, out)
	}
	return rmErr
}

func (s *Server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	err := cmd.Run()
	return out.Bytes(), err
}

func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
		}
	}
	return nil, errors.New("pgserver: running as root and no postgres or nobody user to run the server as")
}
