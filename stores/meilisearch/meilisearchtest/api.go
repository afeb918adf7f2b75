package meilisearchtest

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

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
		writeError(w, http.StatusServiceUnavailable, apiError("service_unavailable", "system", "meilisearchtest: %s refused on purpose", kind))
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
		writeError(w, http.StatusServiceUnavailable, apiError("service_unavailable", "system", "meilisearchtest: unavailable on purpose"))
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
	case path == "/indexes" && r.Method == http.MethodGet:
		s.listIndexes(w, r)
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
			writeError(w, http.StatusNotFound, apiError("not_found", "invalid_request", "meilisearchtest: %s %s is not part of the fake", r.Method, path))
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
					return apiError(code, "internal", "meilisearchtest: document %s failed on purpose (%s)", mustMarshal(d[idx.primaryKey]), code)
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
		writeError(w, http.StatusNotFound, apiError("not_found", "invalid_request", "meilisearchtest: %s /indexes/%s%s is not part of the fake", r.Method, uid, rest))
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

// listIndexes answers GET /indexes, sorted by uid, paged by offset and
// limit (default 20)
// (https://www.meilisearch.com/docs/reference/api/indexes#list-all-indexes).
func (s *Server) listIndexes(w http.ResponseWriter, r *http.Request) {
	offset, limit, ok := paging(w, r)
	if !ok {
		return
	}
	uids := slices.Sorted(maps.Keys(s.indexes))
	results := []map[string]any{}
	for _, uid := range window(uids, offset, limit) {
		idx := s.indexes[uid]
		results = append(results, map[string]any{"uid": uid, "primaryKey": idx.primaryKey, "createdAt": idx.createdAt, "updatedAt": idx.updatedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results, "offset": offset, "limit": limit, "total": len(uids)})
}

// paging reads ?offset= and ?limit= (default 0 and 20), answering 400 for
// a value that is not a non-negative integer.
func paging(w http.ResponseWriter, r *http.Request) (offset, limit int, ok bool) {
	offset, limit = 0, 20
	for name, p := range map[string]*int{"offset": &offset, "limit": &limit} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, apiError("invalid_index_"+name, "invalid_request",
				"Invalid value in parameter `%s`: could not parse `%s` as a positive integer", name, v))
			return 0, 0, false
		}
		*p = n
	}
	return offset, limit, true
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
