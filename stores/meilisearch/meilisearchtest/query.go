package meilisearchtest

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

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
			return nil, apiError(code, "invalid_request", "meilisearchtest: filter %q: only `attr = value [AND …]` is supported", f)
		}
		if !slices.Contains(filterable, attr) {
			return nil, apiError(code, "invalid_request", "Attribute `%s` is not filterable. Available filterable attributes are: `%s`.", attr, strings.Join(filterable, ", "))
		}
		var v any
		if err := json.Unmarshal([]byte(strings.TrimSpace(val)), &v); err != nil {
			return nil, apiError(code, "invalid_request", "meilisearchtest: filter value %s: %v", val, err)
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
