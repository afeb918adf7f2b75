package meilisearchtest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is the fake. Create it with [New] in a test (it stops when the
// test ends), or with [Start] and [Server.Close].
type Server struct {
	addr string

	mu        sync.Mutex
	ln        net.Listener
	srv       *http.Server
	indexes   map[string]*index
	tasks     []*task
	queue     chan *task
	failNext  int
	failCode  string
	failDoc   func(doc map[string]json.RawMessage) bool
	unavail   bool
	delay     time.Duration
	requests  map[string]int
	hooks     map[string]func() bool // kind of request → refuse it now?
	closeOnce sync.Once
	done      chan struct{}
}

type index struct {
	uid        string
	primaryKey string
	docs       map[string]map[string]json.RawMessage
	searchable []string
	filterable []string
	sortable   []string
	createdAt  time.Time
	updatedAt  time.Time
}

type task struct {
	UID        int64            `json:"uid"`
	BatchUID   *int64           `json:"batchUid"`
	IndexUID   *string          `json:"indexUid"`
	Status     string           `json:"status"`
	Type       string           `json:"type"`
	CanceledBy *int64           `json:"canceledBy"`
	Details    map[string]any   `json:"details"`
	Error      *APIError        `json:"error"`
	Duration   *string          `json:"duration"`
	EnqueuedAt time.Time        `json:"enqueuedAt"`
	StartedAt  *time.Time       `json:"startedAt"`
	FinishedAt *time.Time       `json:"finishedAt"`
	run        func() *APIError `json:"-"`
}

// APIError is Meilisearch's error object
// (https://www.meilisearch.com/docs/reference/errors/overview).
type APIError struct {
	Message string `json:"message"`
	Code    string `json:"code"`
	Type    string `json:"type"`
	Link    string `json:"link"`
}

func apiError(code, typ, format string, args ...any) *APIError {
	return &APIError{Message: fmt.Sprintf(format, args...), Code: code, Type: typ, Link: "https://docs.meilisearch.com/errors#" + code}
}

// New starts a fake on a free local port for a test, stopped when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatalf("meilisearchtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start starts a fake on a free local port, for use outside a test
// function (an Example, a TestMain); [Server.Close] stops it.
func Start() (*Server, error) {
	s := &Server{indexes: map[string]*index{}, queue: make(chan *task, 1<<16), requests: map[string]int{}, done: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.addr = ln.Addr().String()
	s.serve(ln)
	go s.worker()
	return s, nil
}

// URL is the fake's base URL, what MEILISEARCH_URL would hold.
func (s *Server) URL() string { return "http://" + s.addr }

func (s *Server) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 5 * time.Second}
	s.ln, s.srv = ln, srv
	go func() { _ = srv.Serve(ln) }()
}

// Close stops the fake: its port closes and its task worker ends. Safe to
// call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.mu.Lock()
		srv := s.srv
		s.srv = nil
		s.mu.Unlock()
		if srv != nil {
			_ = srv.Close()
		}
	})
}

// Down closes the port and every open connection: requests are refused
// until [Server.Up]. Tasks already enqueued still run.
func (s *Server) Down() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Up listens again on the same address after [Server.Down].
func (s *Server) Up(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return
	}
	var ln net.Listener
	var err error
	for range 100 { // the port may linger a moment after the close
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("meilisearchtest: listen again on %s: %v", s.addr, err)
	}
	s.serve(ln)
}

// Unavailable makes every request answer 503 Service Unavailable (as a
// proxy in front of an overloaded or restarting server does) while on.
func (s *Server) Unavailable(on bool) {
	s.mu.Lock()
	s.unavail = on
	s.mu.Unlock()
}

// FailTasks makes the next n document tasks fail with the error code
// (internal when empty), as a task that Meilisearch accepted (202) and
// could not carry out.
func (s *Server) FailTasks(n int, code string) {
	s.mu.Lock()
	s.failNext, s.failCode = n, code
	s.mu.Unlock()
}

// FailDocuments makes every document-addition task that holds a document
// for which match is true fail with the error code (a poison document: it
// fails however often it is sent); nil stops it.
func (s *Server) FailDocuments(match func(doc map[string]json.RawMessage) bool, code string) {
	s.mu.Lock()
	s.failDoc, s.failCode = match, code
	s.mu.Unlock()
}

// SetDelay delays every response by d.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// Requests returns how many requests of a kind ("POST /indexes/{uid}/documents")
// the fake answered, 503s included.
func (s *Server) Requests(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[kind]
}

// Documents returns a copy of an index's documents by primary key.
func (s *Server) Documents(uid string) map[string]map[string]json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.indexes[uid]
	if idx == nil {
		return nil
	}
	out := make(map[string]map[string]json.RawMessage, len(idx.docs))
	for id, d := range idx.docs {
		out[id] = clone(d)
	}
	return out
}

func clone(d map[string]json.RawMessage) map[string]json.RawMessage {
	c := make(map[string]json.RawMessage, len(d))
	for k, v := range d {
		c[k] = v
	}
	return c
}

// worker runs tasks one at a time in enqueue order, as Meilisearch's
// scheduler does for tasks of one index.
func (s *Server) worker() {
	for {
		select {
		case <-s.done:
			return
		case t := <-s.queue:
			s.mu.Lock()
			now := time.Now().UTC()
			t.Status, t.StartedAt = "processing", &now
			s.mu.Unlock()
			s.mu.Lock()
			err := t.run()
			end := time.Now().UTC()
			d := fmt.Sprintf("PT%.6fS", end.Sub(now).Seconds())
			t.FinishedAt, t.Duration = &end, &d
			if err != nil {
				t.Status, t.Error = "failed", err
			} else {
				t.Status = "succeeded"
			}
			s.mu.Unlock()
		}
	}
}

// enqueue records a task (s.mu held) and answers 202 with its summary
// (https://www.meilisearch.com/docs/reference/api/tasks#summarized-task-object).
func (s *Server) enqueue(w http.ResponseWriter, indexUID, typ string, details map[string]any, run func() *APIError) {
	t := &task{UID: int64(len(s.tasks)), Status: "enqueued", Type: typ, Details: details, EnqueuedAt: time.Now().UTC(), run: run}
	if indexUID != "" {
		t.IndexUID = &indexUID
	}
	if strings.HasPrefix(typ, "document") && s.failNext > 0 {
		s.failNext--
		code := cmpOr(s.failCode, "internal")
		t.run = func() *APIError {
			return apiError(code, "internal", "meilisearchtest: task failed on purpose (%s)", code)
		}
	}
	s.tasks = append(s.tasks, t)
	s.queue <- t
	writeJSON(w, http.StatusAccepted, map[string]any{"taskUid": t.UID, "indexUid": t.IndexUID, "status": "enqueued", "type": typ, "enqueuedAt": t.EnqueuedAt})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, e *APIError) { writeJSON(w, status, e) }

// Refuse makes requests of kind (method and path with {uid} for an index
// or task uid, e.g. "POST /swap-indexes") answer 503 while refuse returns
// true; nil removes it. For a test that needs one kind of request to fail
// while the others go through.
func (s *Server) Refuse(kind string, refuse func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hooks == nil {
		s.hooks = map[string]func() bool{}
	}
	if refuse == nil {
		delete(s.hooks, kind)
		return
	}
	s.hooks[kind] = refuse
}

// Index reports whether an index with uid exists and how many documents
// it holds.
func (s *Server) Index(uid string) (exists bool, docs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.indexes[uid]
	if idx == nil {
		return false, 0
	}
	return true, len(idx.docs)
}
