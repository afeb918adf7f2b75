package jetstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
	case "claims":
		os.Exit(runClaimsChild())
	case "park":
		os.Exit(runParkChild())
	default:
		os.Exit(runChild())
	}
	pgtest.Main(m)
}

// natsURL is the shared JetStream server of the machine (NATS_URL).
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return nats.DefaultURL
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// env is one test's schema, store, NATS connection and its own stream name
// and subject prefix on the server, so tests never see each other's
// messages.
type env struct {
	t      testing.TB
	ctx    context.Context
	types  testevents.Types
	store  *postgres.Store
	url    string
	nc     *nats.Conn
	stream string
	prefix string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvAt(t, natsURL())
}

// newEnvAt is newEnv on the NATS server at url; cfg, if given, configures
// the store (its Registry is the env's).
func newEnvAt(t testing.TB, url string, cfg ...postgres.Config) *env {
	t.Helper()
	types := testevents.New()
	id := randomHex(6)
	e := &env{t: t, ctx: context.Background(), types: types, store: pgtest.Store(t, types.Registry, cfg...), url: url,
		stream: "T_" + id, prefix: "t" + id}
	e.nc = connect(t, url)
	t.Cleanup(func() {
		js, err := jetstream.New(e.nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = js.DeleteStream(ctx, e.stream) // best effort: the server may be stopped
		}
	})
	return e
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (e *env) relayConfig() pjs.RelayConfig {
	return pjs.RelayConfig{Conn: e.nc, Registry: e.types.Registry, Stream: e.stream, Prefix: e.prefix,
		PublishTimeout: 2 * time.Second,
		Async:          projection.AsyncConfig{BatchSize: 50, RetryBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 1000}}
}

func (e *env) relay(cfg pjs.RelayConfig) *pjs.Relay {
	e.t.Helper()
	r, err := pjs.NewRelay(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if _, err := r.Ensure(ctx); err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) dispatcher(asyncs ...*projection.Async) *projection.Dispatcher {
	e.t.Helper()
	return e.dispatcherAs("", asyncs...)
}

// dispatcherAs is dispatcher with instance id instance ("" for a random
// one).
func (e *env) dispatcherAs(instance string, asyncs ...*projection.Async) *projection.Dispatcher {
	e.t.Helper()
	d, err := projection.New(projection.Config{Store: e.store, InstanceID: instance, Projections: asyncs, PollMax: 50 * time.Millisecond,
		Recheck: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("stop: %v", err)
		}
	})
	return d
}

// append appends payloads to tenant's ticket stream id.
func (e *env) append(tenant, id string, payloads ...any) {
	e.t.Helper()
	if err := e.appendErr(tenant, id, payloads...); err != nil {
		e.t.Fatalf("append to %s/%s: %v", tenant, id, err)
	}
}

func (e *env) appendErr(tenant, id string, payloads ...any) error {
	return pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.TenantStream(tenant, "ticket", id), projector.AnyVersion, payloads...)
		return err
	})
}

// logEvents reads the whole log, decoded, in log order.
func (e *env) logEvents() []projector.Event {
	e.t.Helper()
	var all []projector.Event
	after := projector.Start
	for {
		b, err := e.store.ReadLog(e.ctx, postgres.LogQuery{After: after, Limit: 1000})
		if err != nil {
			e.t.Fatal(err)
		}
		if len(b.Events) == 0 {
			return all
		}
		all = append(all, b.Events...)
		after = b.Events[len(b.Events)-1].Position
	}
}

// streamMsgs returns every message of the test's JetStream stream in
// stream order.
func (e *env) streamMsgs(nc *nats.Conn) []*jetstream.RawStreamMsg {
	e.t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// checkOnceInOrder asserts that the stream holds every event of the log
// exactly once, that each message decodes back to the logged event, and
// that within each stream the versions come in order.
func (e *env) checkOnceInOrder(msgs []*jetstream.RawStreamMsg) {
	e.t.Helper()
	log := e.logEvents()
	byID := map[string]projector.Event{}
	for _, ev := range log {
		byID[ev.ID.String()] = ev
	}
	seen := map[string]int{}
	last := map[projector.StreamRef]int64{}
	for _, m := range msgs {
		ev, err := pjs.Decode(e.types.Registry, nats.Header(m.Header), m.Data)
		if err != nil {
			e.t.Fatalf("message %d: %v", m.Sequence, err)
		}
		id := ev.ID.String()
		seen[id]++
		want, ok := byID[id]
		if !ok {
			e.t.Fatalf("message %d: event %s is not in the log", m.Sequence, id)
		}
		if ev.Stream != want.Stream || ev.Version != want.Version || ev.Type != want.Type || string(ev.Data) != string(want.Data) || ev.Position != want.Position {
			e.t.Fatalf("message %d decodes to %+v, the log has %+v", m.Sequence, ev, want)
		}
		if m.Subject != pjs.Subject(e.prefix, want) {
			e.t.Fatalf("message %d on %q, want %q", m.Sequence, m.Subject, pjs.Subject(e.prefix, want))
		}
		if ev.Version != last[ev.Stream]+1 {
			e.t.Fatalf("stream %s: version %d after %d", ev.Stream, ev.Version, last[ev.Stream])
		}
		last[ev.Stream] = ev.Version
	}
	for id, n := range seen {
		if n != 1 {
			e.t.Errorf("event %s in the stream %d times", id, n)
		}
	}
	if len(seen) != len(log) {
		e.t.Fatalf("%d distinct events in the stream, %d in the log", len(seen), len(log))
	}
}

func (e *env) msgCount(nc *nats.Conn) uint64 {
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, e.stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// natsServer is a test-owned nats-server (Debian's binary) on a free port,
// which a test may stop and start again with the same store directory.
type natsServer struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nats-server not installed")
		}
		t.Skip("nats-server not installed")
	}
	_ = bin
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	s := &natsServer{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

func (s *natsServer) start() {
	s.t.Helper()
	s.cmd = exec.Command("nats-server", "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-sd", s.dir)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	waitFor(s.t, "nats-server to accept connections", 20*time.Second, func() bool {
		nc, err := nats.Connect(s.url(), nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})
}

func (s *natsServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

func (e *env) String() string { return fmt.Sprintf("stream %s prefix %s", e.stream, e.prefix) }

// uuidFor returns a fixed, distinct event id for i.
func uuidFor(i int) uuid.UUID {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(strconv.Itoa(i)+randomHex(4)))
}
