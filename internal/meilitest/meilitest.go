// Package meilitest is an in-process fake of the parts of Meilisearch's
// HTTP API that stores/meilisearch uses, for tests on machines without a
// Meilisearch server. It is a test double, not a search engine: documents
// live in maps, a search matches query words as prefixes of the searchable
// attributes' words, and filters are the `attr = value [AND …]` form the
// backend writes.
//
// What it keeps faithfully is what the backend's correctness rests on,
// following the API reference (https://www.meilisearch.com/docs/reference/api):
//
//   - writes answer 202 with a summarized task and run later, one at a
//     time, first in first out (Asynchronous operations,
//     /docs/learn/async/asynchronous_operations); a task moves enqueued →
//     processing → succeeded or failed and is polled with GET /tasks/{uid}
//     (/docs/reference/api/tasks#get-one-task);
//   - errors are the documented error object {message, code, type, link}
//     (/docs/reference/errors/overview);
//   - adding documents replaces whole documents, updating merges top-level
//     fields, both create a missing document, and deleting a missing one
//     succeeds (/docs/reference/api/documents);
//   - a swap exchanges two indexes' documents and settings atomically
//     (/docs/reference/api/indexes#swap-indexes).
//
// A test can make it fail: [Server.FailTasks] fails the next document
// tasks with an error object, [Server.Unavailable] answers 503,
// [Server.SetDelay] slows every response, and [Server.Down] / [Server.Up]
// close and reopen its port (connection refused in between).
package meilitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
)

// Server is the fake. Create it with [New]; it stops when the test ends.
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

// New starts a fake on a free local port, stopped when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{indexes: map[string]*index{}, queue: make(chan *task, 1<<16), requests: map[string]int{}, done: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("meilitest: listen: %v", err)
	}
	s.addr = ln.Addr().String()
	s.serve(ln)
	go s.worker()
	t.Cleanup(s.close)
	return s
}

// URL is the fake's base URL, what MEILISEARCH_URL would hold.
func (s *Server) URL() string { return "http://" + s.addr }

func (s *Server) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 5 * time.Second}
	s.ln, s.srv = ln, srv
	go func() { _ = srv.Serve(ln) }()
}

func (s *Server) close() {
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
		t.Fatalf("meilitest: listen again on %s: %v", s.addr, err)
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
		t.run = func() *APIError { return apiError(code, "internal", "meilitest: task failed on purpose (%s)", code) }
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

var indexPath = regexp.MustCompile(`^/indexes/([^/]+)(/.*)?$`)

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	delay, unavail := s.delay, s.unavail
	kind := r.Method + " " + indexPath.ReplaceAllString(r.URL.Path, "/indexes/{uid}$2")
	if strings.HasPrefix(r.URL.Path, "/tasks/") {
		kind = r.Method + " /tasks/{uid}"
	}
	s.requests[kind]++
	hook := s.hooks[kind]
	s.mu.Unlock()
	if hook != nil && hook() {
		writeError(w, http.StatusServiceUnavailable, apiError("service_unavailable", "system", "meilitest: %s refused on purpose", kind))
		return
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	if unavail {
		writeError(w, http.StatusServiceUnavailable, apiError("service_unavailable", "system", "meilitest: unavailable on purpose"))
		return
	}
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			writeError(w, http.StatusBadRequest, apiError("bad_request", "invalid_request", "read body: %v", err))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	path := r.URL.Path
	switch {
	case path == "/health" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"status": "available"})
	case path == "/indexes" && r.Method == http.MethodPost:
		s.createIndex(w, body)
	case path == "/swap-indexes" && r.Method == http.MethodPost:
		s.swap(w, body)
	case path == "/tasks" && r.Method == http.MethodGet:
		s.listTasks(w, r)
	case strings.HasPrefix(path, "/tasks/") && r.Method == http.MethodGet:
		uid, err := strconv.ParseInt(strings.TrimPrefix(path, "/tasks/"), 10, 64)
		if err != nil || uid < 0 || uid >= int64(len(s.tasks)) {
			writeError(w, http.StatusNotFound, apiError("task_not_found", "invalid_request", "Task `%s` not found.", strings.TrimPrefix(path, "/tasks/")))
			return
		}
		writeJSON(w, http.StatusOK, s.tasks[uid])
	default:
		m := indexPath.FindStringSubmatch(path)
		if m == nil {
			writeError(w, http.StatusNotFound, apiError("not_found", "invalid_request", "meilitest: %s %s is not part of the fake", r.Method, path))
			return
		}
		s.indexRoute(w, r, m[1], m[2], body)
	}
}

// indexRoute serves /indexes/{uid}/… (s.mu held).
func (s *Server) indexRoute(w http.ResponseWriter, r *http.Request, uid, rest string, body []byte) {
	notFound := func() {
		writeError(w, http.StatusNotFound, apiError("index_not_found", "invalid_request", "Index `%s` not found.", uid))
	}
	idx := s.indexes[uid]
	switch {
	case rest == "" && r.Method == http.MethodGet:
		if idx == nil {
			notFound()
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"uid": uid, "primaryKey": idx.primaryKey, "createdAt": idx.createdAt, "updatedAt": idx.updatedAt})
	case rest == "" && r.Method == http.MethodDelete:
		s.enqueue(w, uid, "indexDeletion", map[string]any{"deletedDocuments": 0}, func() *APIError {
			if s.indexes[uid] == nil {
				return apiError("index_not_found", "invalid_request", "Index `%s` not found.", uid)
			}
			delete(s.indexes, uid)
			return nil
		})
	case rest == "/settings" && r.Method == http.MethodPatch:
		var req struct {
			Searchable *[]string `json:"searchableAttributes"`
			Filterable *[]string `json:"filterableAttributes"`
			Sortable   *[]string `json:"sortableAttributes"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			writeError(w, http.StatusBadRequest, apiError("bad_request", "invalid_request", "settings: %v", err))
			return
		}
		s.enqueue(w, uid, "settingsUpdate", map[string]any{}, func() *APIError {
			idx := s.ensureIndex(uid, "")
			if req.Searchable != nil {
				idx.searchable = *req.Searchable
			}
			if req.Filterable != nil {
				idx.filterable = *req.Filterable
			}
			if req.Sortable != nil {
				idx.sortable = *req.Sortable
			}
			return nil
		})
	case rest == "/documents" && (r.Method == http.MethodPost || r.Method == http.MethodPut):
		var docs []map[string]json.RawMessage
		if err := json.Unmarshal(body, &docs); err != nil {
			writeError(w, http.StatusBadRequest, apiError("malformed_payload", "invalid_request", "The `json` payload provided is malformed. %v", err))
			return
		}
		replace := r.Method == http.MethodPost
		pk := r.URL.Query().Get("primaryKey")
		s.enqueue(w, uid, "documentAdditionOrUpdate", map[string]any{"receivedDocuments": len(docs), "indexedDocuments": nil}, func() *APIError {
			idx := s.ensureIndex(uid, pk)
			if idx.primaryKey == "" {
				return apiError("index_primary_key_no_candidate_found", "invalid_request", "The primary key inference failed")
			}
			// A task is all or nothing: check every document first.
			ids := make([]string, len(docs))
			for i, d := range docs {
				if s.failDoc != nil && s.failDoc(d) {
					code := cmpOr(s.failCode, "internal")
					return apiError(code, "internal", "meilitest: document %s failed on purpose (%s)", mustMarshal(d[idx.primaryKey]), code)
				}
				id, e := docID(d, idx.primaryKey)
				if e != nil {
					return e
				}
				ids[i] = id
			}
			for i, d := range docs {
				if old, ok := idx.docs[ids[i]]; ok && !replace {
					merged := clone(old)
					for k, v := range d {
						merged[k] = v
					}
					d = merged
				}
				idx.docs[ids[i]] = clone(d)
			}
			idx.updatedAt = time.Now().UTC()
			return nil
		})
	case rest == "/documents/delete-batch" && r.Method == http.MethodPost:
		var ids []json.RawMessage
		if err := json.Unmarshal(body, &ids); err != nil {
			writeError(w, http.StatusBadRequest, apiError("malformed_payload", "invalid_request", "delete-batch: %v", err))
			return
		}
		s.enqueue(w, uid, "documentDeletion", map[string]any{"providedIds": len(ids)}, func() *APIError {
			idx := s.indexes[uid]
			if idx == nil {
				return apiError("index_not_found", "invalid_request", "Index `%s` not found.", uid)
			}
			for _, raw := range ids {
				var id string
				if json.Unmarshal(raw, &id) != nil {
					id = string(raw)
				}
				delete(idx.docs, id)
			}
			return nil
		})
	case rest == "/documents/delete" && r.Method == http.MethodPost:
		var req struct {
			Filter string `json:"filter"`
		}
		if err := json.Unmarshal(body, &req); err != nil || req.Filter == "" {
			writeError(w, http.StatusBadRequest, apiError("invalid_document_filter", "invalid_request", "Invalid syntax for the filter parameter: `expected String, found: %s`.", body))
			return
		}
		s.enqueue(w, uid, "documentDeletion", map[string]any{"originalFilter": strconv.Quote(req.Filter)}, func() *APIError {
			idx := s.indexes[uid]
			if idx == nil {
				return apiError("index_not_found", "invalid_request", "Index `%s` not found.", uid)
			}
			conds, e := parseFilter(req.Filter, idx.filterable, "invalid_document_filter")
			if e != nil {
				return e
			}
			for id, d := range idx.docs {
				if matches(d, conds) {
					delete(idx.docs, id)
				}
			}
			return nil
		})
	case rest == "/documents/fetch" && r.Method == http.MethodPost:
		if idx == nil {
			notFound()
			return
		}
		var req struct {
			Offset int `json:"offset"`
			Limit  int `json:"limit"`
		}
		_ = json.Unmarshal(body, &req)
		if req.Limit == 0 {
			req.Limit = 20
		}
		ids := slices.Sorted(mapsKeys(idx.docs))
		page := window(ids, req.Offset, req.Limit)
		results := make([]map[string]json.RawMessage, len(page))
		for i, id := range page {
			results[i] = idx.docs[id]
		}
		writeJSON(w, http.StatusOK, map[string]any{"results": results, "offset": req.Offset, "limit": req.Limit, "total": len(ids)})
	case rest == "/search" && r.Method == http.MethodPost:
		if idx == nil {
			notFound()
			return
		}
		s.search(w, idx, body)
	default:
		writeError(w, http.StatusNotFound, apiError("not_found", "invalid_request", "meilitest: %s /indexes/%s%s is not part of the fake", r.Method, uid, rest))
	}
}

func mapsKeys(m map[string]map[string]json.RawMessage) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func window(ids []string, offset, limit int) []string {
	if offset >= len(ids) {
		return nil
	}
	return ids[offset:min(len(ids), offset+limit)]
}

// ensureIndex returns uid's index, creating it as adding documents does.
func (s *Server) ensureIndex(uid, pk string) *index {
	idx := s.indexes[uid]
	if idx == nil {
		now := time.Now().UTC()
		idx = &index{uid: uid, primaryKey: pk, docs: map[string]map[string]json.RawMessage{}, searchable: []string{"*"}, createdAt: now, updatedAt: now}
		s.indexes[uid] = idx
	}
	if idx.primaryKey == "" {
		idx.primaryKey = pk
	}
	return idx
}

func (s *Server) createIndex(w http.ResponseWriter, body []byte) {
	var req struct {
		UID        string `json:"uid"`
		PrimaryKey string `json:"primaryKey"`
	}
	if err := json.Unmarshal(body, &req); err != nil || !uidPattern.MatchString(req.UID) {
		writeError(w, http.StatusBadRequest, apiError("invalid_index_uid", "invalid_request", "`%s` is not a valid index uid.", req.UID))
		return
	}
	s.enqueue(w, req.UID, "indexCreation", map[string]any{"primaryKey": req.PrimaryKey}, func() *APIError {
		if s.indexes[req.UID] != nil {
			return apiError("index_already_exists", "invalid_request", "Index `%s` already exists.", req.UID)
		}
		s.ensureIndex(req.UID, req.PrimaryKey)
		return nil
	})
}

// swap exchanges indexes pairwise in one task
// (https://www.meilisearch.com/docs/reference/api/indexes#swap-indexes).
func (s *Server) swap(w http.ResponseWriter, body []byte) {
	var req []swapPair
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, apiError("invalid_swap_indexes", "invalid_request", "swap: %v", err))
		return
	}
	s.enqueue(w, "", "indexSwap", map[string]any{"swaps": req}, func() *APIError {
		for _, p := range req {
			if len(p.Indexes) != 2 {
				return apiError("invalid_swap_indexes", "invalid_request", "Two indexes must be given for each swap.")
			}
			for _, uid := range p.Indexes {
				if s.indexes[uid] == nil {
					return apiError("index_not_found", "invalid_request", "Indexes `%s` not found.", uid)
				}
			}
		}
		for _, p := range req {
			a, b := s.indexes[p.Indexes[0]], s.indexes[p.Indexes[1]]
			a.uid, b.uid = b.uid, a.uid
			s.indexes[a.uid], s.indexes[b.uid] = a, b
		}
		return nil
	})
}

// listTasks serves GET /tasks
// (https://www.meilisearch.com/docs/reference/api/tasks#get-tasks): the
// tasks matching the comma-separated filters uids, types, statuses and
// indexUids, newest first, limit (default 20) from the task uid from, with
// the uid of the next older match as next (null when none). For an
// indexSwap task, indexUids matches the indexes it swaps (s.mu held).
func (s *Server) listTasks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	set := func(name string) map[string]bool {
		v := q.Get(name)
		if v == "" || v == "*" {
			return nil
		}
		m := map[string]bool{}
		for _, x := range strings.Split(v, ",") {
			m[x] = true
		}
		return m
	}
	uids, types, statuses, indexes := set("uids"), set("types"), set("statuses"), set("indexUids")
	limit, from := 20, int64(len(s.tasks)-1)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, apiError("invalid_task_limit", "invalid_request", "Invalid value in parameter `limit`: could not parse `%s` as a positive integer", v))
			return
		}
		limit = n
	}
	if v := q.Get("from"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, apiError("invalid_task_from", "invalid_request", "Invalid value in parameter `from`: could not parse `%s` as a positive integer", v))
			return
		}
		from = min(from, n)
	}
	match := func(t *task) bool {
		if uids != nil && !uids[strconv.FormatInt(t.UID, 10)] || types != nil && !types[t.Type] || statuses != nil && !statuses[t.Status] {
			return false
		}
		if indexes == nil {
			return true
		}
		if t.IndexUID != nil {
			return indexes[*t.IndexUID]
		}
		if swaps, ok := t.Details["swaps"].([]swapPair); ok {
			for _, p := range swaps {
				if slices.ContainsFunc(p.Indexes, func(uid string) bool { return indexes[uid] }) {
					return true
				}
			}
		}
		return false
	}
	results := []*task{}
	var next *int64
	total := 0
	for i := len(s.tasks) - 1; i >= 0; i-- {
		t := s.tasks[i]
		if !match(t) {
			continue
		}
		total++
		if t.UID > from {
			continue
		}
		if len(results) < limit {
			results = append(results, t)
		} else if next == nil {
			uid := t.UID
			next = &uid
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results, "total": total, "limit": limit, "from": firstUID(results), "next": next})
}

func firstUID(ts []*task) *int64 {
	if len(ts) == 0 {
		return nil
	}
	return &ts[0].UID
}

// swapPair is one pair of a swap-indexes request.
type swapPair struct {
	Indexes []string `json:"indexes"`
	Rename  bool     `json:"rename"`
}

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

var (
	uidPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,400}$`)
	idPattern  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,511}$`)
)

// docID reads a document's primary key as Meilisearch validates it
// (https://www.meilisearch.com/docs/learn/getting_started/primary_key#formatting-the-document-id).
func docID(d map[string]json.RawMessage, pk string) (string, *APIError) {
	raw, ok := d[pk]
	if !ok {
		return "", apiError("missing_document_id", "invalid_request", "Document doesn't have a `%s` attribute: `%s`.", pk, mustMarshal(d))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if !idPattern.MatchString(s) {
			return "", apiError("invalid_document_id", "invalid_request", "Document identifier `%q` is invalid. A document identifier can be of type integer or string, only composed of alphanumeric characters (a-z A-Z 0-9), hyphens (-) and underscores (_), and can not be more than 511 bytes.", s)
		}
		return s, nil
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err == nil {
		return strconv.FormatInt(n, 10), nil
	}
	return "", apiError("invalid_document_id", "invalid_request", "Document identifier `%s` is invalid.", raw)
}

func mustMarshal(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

type cond struct {
	attr  string
	value any
}

// parseFilter reads `attr = value` conditions joined by AND, where value
// is a double-quoted string (backslash escapes), a number or a boolean,
// and checks each attribute is filterable, as Meilisearch does
// (https://www.meilisearch.com/docs/learn/filtering_and_sorting/filter_expression_reference).
func parseFilter(f string, filterable []string, code string) ([]cond, *APIError) {
	var out []cond
	for part := range strings.SplitSeq(f, " AND ") {
		attr, val, ok := strings.Cut(part, " = ")
		attr = strings.TrimSpace(attr)
		if !ok || attr == "" {
			return nil, apiError(code, "invalid_request", "meilitest: filter %q: only `attr = value [AND …]` is supported", f)
		}
		if !slices.Contains(filterable, attr) {
			return nil, apiError(code, "invalid_request", "Attribute `%s` is not filterable. Available filterable attributes are: `%s`.", attr, strings.Join(filterable, ", "))
		}
		var v any
		if err := json.Unmarshal([]byte(strings.TrimSpace(val)), &v); err != nil {
			return nil, apiError(code, "invalid_request", "meilitest: filter value %s: %v", val, err)
		}
		out = append(out, cond{attr: attr, value: v})
	}
	return out, nil
}

func matches(d map[string]json.RawMessage, conds []cond) bool {
	for _, c := range conds {
		raw, ok := d[c.attr]
		if !ok {
			return false
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return false
		}
		if arr, ok := v.([]any); ok {
			if !slices.ContainsFunc(arr, func(e any) bool { return e == c.value }) {
				return false
			}
		} else if v != c.value {
			return false
		}
	}
	return true
}

// search answers POST /indexes/{uid}/search
// (https://www.meilisearch.com/docs/reference/api/search#search-in-an-index-with-post).
func (s *Server) search(w http.ResponseWriter, idx *index, body []byte) {
	var req struct {
		Q      string   `json:"q"`
		Filter string   `json:"filter"`
		Sort   []string `json:"sort"`
		Limit  *int     `json:"limit"`
		Offset int      `json:"offset"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, apiError("bad_request", "invalid_request", "search: %v", err))
		return
	}
	limit := 20
	if req.Limit != nil {
		limit = *req.Limit
	}
	var conds []cond
	if req.Filter != "" {
		var e *APIError
		if conds, e = parseFilter(req.Filter, idx.filterable, "invalid_search_filter"); e != nil {
			writeError(w, http.StatusBadRequest, e)
			return
		}
	}
	words := tokens(req.Q)
	var ids []string
	for id, d := range idx.docs {
		if matches(d, conds) && textMatches(d, idx.searchable, words) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for i := len(req.Sort) - 1; i >= 0; i-- {
		attr, dir, _ := strings.Cut(req.Sort[i], ":")
		if !slices.Contains(idx.sortable, attr) {
			writeError(w, http.StatusBadRequest, apiError("invalid_search_sort", "invalid_request", "Attribute `%s` is not sortable.", attr))
			return
		}
		slices.SortStableFunc(ids, func(a, b string) int {
			x, y := idx.docs[a][attr], idx.docs[b][attr]
			switch {
			case x == nil || y == nil: // a missing value comes last either way
				return compareAttr(x, y)
			case dir == "desc":
				return -compareAttr(x, y)
			}
			return compareAttr(x, y)
		})
	}
	hits := []map[string]json.RawMessage{}
	for _, id := range window(ids, req.Offset, limit) {
		hits = append(hits, idx.docs[id])
	}
	writeJSON(w, http.StatusOK, map[string]any{"hits": hits, "query": req.Q, "processingTimeMs": 0, "limit": limit, "offset": req.Offset, "estimatedTotalHits": len(ids)})
}

// compareAttr orders numbers numerically and anything else as JSON text;
// a missing value comes last.
func compareAttr(a, b json.RawMessage) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return 1
	case b == nil:
		return -1
	}
	var x, y float64
	if json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil {
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	}
	return strings.Compare(string(a), string(b))
}

func tokens(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
}

// textMatches: every query word is a prefix of a word of a searchable
// attribute.
func textMatches(d map[string]json.RawMessage, searchable []string, words []string) bool {
	if len(words) == 0 {
		return true
	}
	var text []string
	for k, raw := range d {
		if !slices.Contains(searchable, "*") && !slices.Contains(searchable, k) {
			continue
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			continue
		}
		collect(v, &text)
	}
	for _, w := range words {
		if !slices.ContainsFunc(text, func(t string) bool { return strings.HasPrefix(t, w) }) {
			return false
		}
	}
	return true
}

func collect(v any, out *[]string) {
	switch x := v.(type) {
	case string:
		*out = append(*out, tokens(x)...)
	case []any:
		for _, e := range x {
			collect(e, out)
		}
	}
}
