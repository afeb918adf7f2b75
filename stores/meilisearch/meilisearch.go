// Package meilisearch is the Meilisearch search backend, on
// github.com/meilisearch/meilisearch-go.
//
// Meilisearch is outside the dispatcher's transaction, so indexing is at
// least once, made harmless by idempotence: documents are upserted and
// patched by primary key, and deleting a missing document succeeds. The
// order of writes comes from there being one writer per index (the
// consumer's shard) and from Meilisearch running an index's tasks first in
// first out. A 202 only means "enqueued": [Backend.Apply] returns once
// every task of the batch is reported succeeded, so the cursor, committed
// after it, never passes a document that is not indexed (the opposite of
// saving progress before the work is confirmed, which is how meilisync
// lost documents).
//
// A failed task is a handler error for the consumer's error mode. An
// unreachable or overloaded server (connection refused, 5xx, a deadline)
// is one too, wrapped in [ErrUnavailable]: the dispatcher retries the
// batch with its backoff, visible in status and metrics. The client's own
// silent retries are turned off so the dispatcher's backoff is the only
// one and a retry never eats the batch's deadline unseen.
//
// Stored documents carry two attributes of Projector's own:
// projector_tenant (filterable: [search.Search] adds it to every query of a
// tenant-owned index) and projector_key, the Meilisearch primary key, made
// from the tenant and the document's id so two tenants' documents with the
// same id never overwrite each other.
package meilisearch

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	meili "github.com/meilisearch/meilisearch-go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/search"
)

// ErrUnavailable: Meilisearch could not be reached or answered with a
// server error; the batch is retried with backoff.
var ErrUnavailable = errors.New("meilisearch: unavailable")

// ErrTaskFailed: Meilisearch accepted a write and reported its task
// failed; the error carries the task's error code and message.
var ErrTaskFailed = errors.New("meilisearch: task failed")

// Attributes Projector adds to every stored document.
const (
	KeyAttr    = "projector_key"
	TenantAttr = "projector_tenant"
)

// Defaults of [Config].
const (
	DefaultRequestTimeout = 10 * time.Second
	DefaultTaskTimeout    = 30 * time.Second
	DefaultPollInterval   = 20 * time.Millisecond
)

// Config configures the backend.
type Config struct {
	// URL of the server, default $MEILISEARCH_URL.
	URL string
	// APIKey, default $MEILISEARCH_API_KEY.
	APIKey string
	// IndexPrefix is put before every index name to make its uid: to share
	// a server between environments or applications.
	IndexPrefix string
	// RequestTimeout bounds each HTTP request, default
	// [DefaultRequestTimeout].
	RequestTimeout time.Duration
	// TaskTimeout bounds how long Apply waits for a batch's tasks, default
	// [DefaultTaskTimeout]; keep it below the consumer's BatchTimeout.
	TaskTimeout time.Duration
	// PollInterval is how often a task's status is asked for, default
	// [DefaultPollInterval].
	PollInterval time.Duration
}

// Backend keeps search indexes in Meilisearch.
type Backend struct {
	cfg    Config
	client meili.ServiceManager
	// suffix is added to every uid: "" for the live indexes, shadowSuffix
	// for the backend Shadow returns.
	suffix string
}

// shadowSuffix names the index a reindex builds beside the live one.
const shadowSuffix = "__reindex"

// New returns a backend for the server cfg names. It does not connect:
// [Backend.Ensure] at start does, and says clearly when that fails.
func New(cfg Config) (*Backend, error) {
	cfg.URL = cmp.Or(cfg.URL, os.Getenv("MEILISEARCH_URL"))
	cfg.APIKey = cmp.Or(cfg.APIKey, os.Getenv("MEILISEARCH_API_KEY"))
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, DefaultRequestTimeout)
	cfg.TaskTimeout = cmp.Or(cfg.TaskTimeout, DefaultTaskTimeout)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	switch {
	case cfg.URL == "":
		return nil, errors.New("meilisearch: no server URL (Config.URL or MEILISEARCH_URL)")
	case !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://"):
		return nil, fmt.Errorf("meilisearch: server URL %s: want http:// or https://", projector.Quoted(RedactURL(cfg.URL)))
	case cfg.RequestTimeout < 0 || cfg.TaskTimeout < 0 || cfg.PollInterval < 0:
		return nil, errors.New("meilisearch: negative timeout or interval")
	}
	opts := []meili.Option{meili.DisableRetries(), meili.WithCustomClient(&http.Client{Timeout: cfg.RequestTimeout})}
	if cfg.APIKey != "" {
		opts = append(opts, meili.WithAPIKey(cfg.APIKey))
	}
	return &Backend{cfg: cfg, client: meili.New(cfg.URL, opts...)}, nil
}

// RedactURL is url with the password of its user info replaced by
// "xxxxx" (net/url's Redacted), for messages and logs; a URL that does not
// parse, or whose '@' net/url does not read as user info (no scheme), loses
// everything before its last '@' instead.
func RedactURL(url string) string {
	if u, err := neturl.Parse(url); err == nil && (u.User != nil || !strings.Contains(url, "@")) {
		return u.Redacted()
	}
	if at := strings.LastIndexByte(url, '@'); at >= 0 {
		start := 0
		if i := strings.Index(url, "://"); i >= 0 && i < at {
			start = i + len("://")
		}
		return url[:start] + "xxxxx" + url[at:]
	}
	return url
}

// Kind names the backend.
func (b *Backend) Kind() string { return "meilisearch" }

// UID returns the Meilisearch index uid of idx.
func (b *Backend) UID(idx search.Index) string { return b.cfg.IndexPrefix + idx.Name + b.suffix }

// Shadow creates an empty index beside idx's live one (uid + "__reindex")
// with idx's settings, deleting one an earlier attempt left, and returns a
// backend writing to it: the first step of search.Reindex.
func (b *Backend) Shadow(ctx context.Context, idx search.Index) (search.Backend, error) {
	if err := b.DropShadow(ctx, idx); err != nil {
		return nil, err
	}
	s := &Backend{cfg: b.cfg, client: b.client, suffix: shadowSuffix}
	if err := s.Ensure(ctx, idx); err != nil {
		return nil, err
	}
	return s, nil
}

// Swap swaps idx's live index with its shadow in one task
// (https://www.meilisearch.com/docs/reference/api/indexes#swap-indexes),
// so searches go from the old documents to the new at once, then deletes
// the old ones (now under the shadow's uid).
func (b *Backend) Swap(ctx context.Context, idx search.Index) error {
	if err := b.swap(ctx, b.UID(idx), b.UID(idx)+shadowSuffix); err != nil {
		return err
	}
	return b.DropShadow(ctx, idx)
}

// swap swaps the indexes live and shadow in one task and waits for it.
func (b *Backend) swap(ctx context.Context, live, shadow string) error {
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	t, err := b.client.SwapIndexes(rctx, []*meili.SwapIndexesParams{{Indexes: []string{live, shadow}}})
	cancel()
	if err != nil {
		return b.requestError("swap "+live+" and "+shadow, err)
	}
	if err := b.wait(ctx, []int64{t.TaskUID}); err != nil {
		return fmt.Errorf("swap %s and %s: %w", live, shadow, err)
	}
	return nil
}

// DropShadow deletes idx's shadow index if there is one.
func (b *Backend) DropShadow(ctx context.Context, idx search.Index) error {
	return b.deleteIndex(ctx, b.UID(idx)+shadowSuffix)
}

// deleteIndex deletes the index uid; a missing one is fine.
func (b *Backend) deleteIndex(ctx context.Context, uid string) error {
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	t, err := b.client.DeleteIndex(rctx, uid)
	cancel()
	if err != nil {
		return b.requestError("delete "+uid, err)
	}
	if err := b.wait(ctx, []int64{t.TaskUID}); err != nil && !strings.Contains(err.Error(), "index_not_found") {
		return fmt.Errorf("delete %s: %w", uid, err)
	}
	return nil
}

// rebuildSuffix names the index a blue/green rebuild builds: unique to
// the rebuild, which is what makes its swap recognisable afterwards.
func rebuildSuffix(rebuildID int64) string { return fmt.Sprintf("__rebuild_%d", rebuildID) }

// RebuildShadow returns a backend writing to rebuild rebuildID's shadow of
// each index (uid + "__rebuild_<id>"): a search projection's handlers write
// through it during the rebuild's shadow passes.
func (b *Backend) RebuildShadow(rebuildID int64) search.Backend {
	return &Backend{cfg: b.cfg, client: b.client, suffix: b.suffix + rebuildSuffix(rebuildID)}
}

// PrepareRebuild creates rebuild rebuildID's empty shadow of idx with
// idx's settings, deleting one a failed earlier attempt left.
func (b *Backend) PrepareRebuild(ctx context.Context, idx search.Index, rebuildID int64) error {
	s := b.RebuildShadow(rebuildID).(*Backend)
	if err := b.deleteIndex(ctx, s.UID(idx)); err != nil {
		return err
	}
	return s.Ensure(ctx, idx)
}

// DropRebuild deletes rebuild rebuildID's shadow of idx, if there is one.
func (b *Backend) DropRebuild(ctx context.Context, idx search.Index, rebuildID int64) error {
	return b.deleteIndex(ctx, b.RebuildShadow(rebuildID).(*Backend).UID(idx))
}

// SwapRebuild makes rebuild rebuildID's shadow idx's live index with one
// swap-indexes task and deletes the index it replaced (then under the
// shadow's uid). It may run again after a crash at any point, and must
// never swap the two back, so it first finds out how far an earlier run got:
//
//   - no index under the shadow's uid: swapped and deleted already;
//   - a swap task naming the shadow's uid (GET /tasks, types=indexSwap;
//     the uid is unique to the rebuild) that is enqueued or processing is
//     waited for, one that succeeded means the swap happened: only the
//     deletion is left;
//   - otherwise (none, or only failed ones) the swap is still to do.
func (b *Backend) SwapRebuild(ctx context.Context, idx search.Index, rebuildID int64) error {
	live := b.UID(idx)
	shadow := b.RebuildShadow(rebuildID).(*Backend).UID(idx)
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	_, err := b.client.GetIndex(rctx, shadow)
	cancel()
	switch {
	case err != nil && statusOf(err) == http.StatusNotFound:
		return nil
	case err != nil:
		return b.requestError("get index "+shadow, err)
	}
	swapped, err := b.swapDone(ctx, live, shadow)
	if err != nil {
		return err
	}
	if !swapped {
		if err := b.swap(ctx, live, shadow); err != nil {
			return err
		}
	}
	return b.deleteIndex(ctx, shadow)
}

// swapDone reports whether a swap of live and shadow succeeded, waiting
// for one still queued or running.
func (b *Backend) swapDone(ctx context.Context, live, shadow string) (bool, error) {
	q := &meili.TasksQuery{Types: []meili.TaskType{meili.TaskTypeIndexSwap}, Limit: 100}
	for {
		rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
		res, err := b.client.GetTasks(rctx, q)
		cancel()
		if err != nil {
			return false, b.requestError("list swap tasks", err)
		}
		for _, t := range res.Results {
			if !slices.ContainsFunc(t.Details.Swaps, func(p meili.SwapIndexesParams) bool {
				return slices.Contains(p.Indexes, live) && slices.Contains(p.Indexes, shadow)
			}) {
				continue
			}
			switch t.Status {
			case meili.TaskStatusSucceeded:
				return true, nil
			case meili.TaskStatusEnqueued, meili.TaskStatusProcessing:
				err := b.wait(ctx, []int64{t.UID})
				if err == nil {
					return true, nil
				}
				if !errors.Is(err, ErrTaskFailed) {
					return false, err
				}
			}
		}
		if len(res.Results) == 0 || res.Next <= 0 {
			return false, nil
		}
		q.From = res.Next
	}
}

// Ensure creates the index with Projector's primary key if it does not
// exist and applies its settings, waiting for both tasks.
func (b *Backend) Ensure(ctx context.Context, idx search.Index) error {
	if err := idx.Validate(); err != nil {
		return err
	}
	uid := b.UID(idx)
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	info, err := b.client.GetIndex(rctx, uid)
	cancel()
	switch {
	case err == nil && info.PrimaryKey != KeyAttr:
		return fmt.Errorf("index %q exists with primary key %q, not %q: it was not made by Projector; delete it or choose another IndexPrefix", uid, info.PrimaryKey, KeyAttr)
	case err != nil && statusOf(err) == http.StatusNotFound:
		rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
		t, err := b.client.CreateIndex(rctx, &meili.IndexConfig{Uid: uid, PrimaryKey: KeyAttr})
		cancel()
		if err != nil {
			return b.requestError("create index "+uid, err)
		}
		if err := b.wait(ctx, []int64{t.TaskUID}); err != nil && !strings.Contains(err.Error(), "index_already_exists") {
			return fmt.Errorf("create index %s: %w", uid, err)
		}
	case err != nil:
		return b.requestError("get index "+uid, err)
	}
	searchable := idx.Searchable
	if len(searchable) == 0 {
		searchable = []string{"*"}
	}
	rctx, cancel = context.WithTimeout(ctx, b.cfg.RequestTimeout)
	t, err := b.client.Index(uid).UpdateSettings(rctx, &meili.Settings{
		SearchableAttributes: searchable,
		FilterableAttributes: append(slices.Clone(idx.Filterable), TenantAttr),
		SortableAttributes:   idx.Sortable,
	})
	cancel()
	if err != nil {
		return b.requestError("update settings of "+uid, err)
	}
	if err := b.wait(ctx, []int64{t.TaskUID}); err != nil {
		return fmt.Errorf("update settings of %s: %w", uid, err)
	}
	return nil
}

// key is the stored primary key: hex keeps any tenant and id within
// Meilisearch's id alphabet, and the tenant part keeps tenants apart.
func key(tenant, id string) string {
	return "t" + hex.EncodeToString([]byte(tenant)) + "-" + hex.EncodeToString([]byte(id))
}

// Apply sends ops in as few requests as the API allows (compacted with
// [search.Compact], the upserts are one request, the patches one, the
// deletes one, and each delete-where one) and waits until Meilisearch reports every task
// succeeded. tx is not used: Meilisearch is outside the transaction.
func (b *Backend) Apply(ctx context.Context, _ pgx.Tx, idx search.Index, ops []search.Op) error {
	uid := b.UID(idx)
	index := b.client.Index(uid)
	var tasks []int64
	ops = search.Compact(ops)
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && ops[j].Kind == ops[i].Kind && ops[i].Kind != search.OpDeleteWhere {
			j++
		}
		run := ops[i:j]
		i = j
		rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
		var info *meili.TaskInfo
		var err error
		what := run[0].Kind.String()
		switch run[0].Kind {
		case search.OpUpsert:
			info, err = index.AddDocuments(rctx, merged(run), &meili.DocumentOptions{PrimaryKey: ptr(KeyAttr)})
		case search.OpPatch:
			info, err = index.UpdateDocuments(rctx, merged(run), &meili.DocumentOptions{PrimaryKey: ptr(KeyAttr)})
		case search.OpDelete:
			keys := make([]string, len(run))
			for k, op := range run {
				keys[k] = key(op.Tenant, op.ID)
			}
			info, err = index.DeleteDocuments(rctx, keys, nil)
		case search.OpDeleteWhere:
			var f string
			if f, err = filter(run[0].Tenant, run[0].Filters, !idx.Shared); err == nil {
				info, err = index.DeleteDocumentsByFilter(rctx, f, nil)
			}
		default:
			err = fmt.Errorf("unknown operation %v", run[0].Kind)
		}
		cancel()
		if err != nil {
			return b.requestError(what+" in "+uid, err)
		}
		tasks = append(tasks, info.TaskUID)
	}
	return b.wait(ctx, tasks)
}

func ptr[T any](v T) *T { return &v }

// merged turns a run of upserts (last wins) or patches (merged in order)
// into one document per key, in first-seen order, with Projector's
// attributes added.
func merged(run []search.Op) []map[string]json.RawMessage {
	var order []string
	docs := map[string]map[string]json.RawMessage{}
	for _, op := range run {
		k := key(op.Tenant, op.ID)
		d, seen := docs[k]
		if !seen {
			order = append(order, k)
		}
		if op.Kind == search.OpUpsert || !seen {
			d = map[string]json.RawMessage{}
		}
		for a, v := range op.Doc {
			d[a] = v
		}
		kj, _ := json.Marshal(k)
		tj, _ := json.Marshal(op.Tenant)
		d[KeyAttr], d[TenantAttr] = kj, tj
		docs[k] = d
	}
	out := make([]map[string]json.RawMessage, len(order))
	for i, k := range order {
		out[i] = docs[k]
	}
	return out
}

// filter renders `projector_tenant = "t" AND attr = value …`, strings
// double-quoted with backslash escapes
// (https://www.meilisearch.com/docs/learn/filtering_and_sorting/filter_expression_reference).
func filter(tenant string, filters []search.Filter, byTenant bool) (string, error) {
	var parts []string
	if byTenant {
		parts = append(parts, TenantAttr+" = "+quote(tenant))
	}
	for _, f := range filters {
		v, err := f.JSON()
		if err != nil {
			return "", err
		}
		if s, ok := f.Value.(string); ok {
			parts = append(parts, f.Attr+" = "+quote(s))
		} else {
			parts = append(parts, f.Attr+" = "+string(v))
		}
	}
	return strings.Join(parts, " AND "), nil
}

func quote(s string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`) + `"`
}

// wait polls each task until it finished; the first failure is returned
// with its error object.
func (b *Backend) wait(ctx context.Context, tasks []int64) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.TaskTimeout)
	defer cancel()
	for _, uid := range tasks {
		for {
			rctx, rcancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
			t, err := b.client.GetTask(rctx, uid)
			rcancel()
			if err != nil {
				return b.requestError(fmt.Sprintf("poll task %d", uid), err)
			}
			if t.Status == meili.TaskStatusSucceeded {
				break
			}
			if t.Status == meili.TaskStatusFailed || t.Status == meili.TaskStatusCanceled {
				return fmt.Errorf("%w: task %d (%s on %s) %s: %s: %s", ErrTaskFailed, uid, t.Type, t.IndexUID, t.Status, t.Error.Code, t.Error.Message)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w: task %d still %s after %v: %w", ErrUnavailable, uid, t.Status, b.cfg.TaskTimeout, ctx.Err())
			case <-time.After(b.cfg.PollInterval):
			}
		}
	}
	return nil
}

// statusOf returns the HTTP status of a failed request, 0 when none came.
func statusOf(err error) int {
	var me *meili.Error
	if errors.As(err, &me) {
		return me.StatusCode
	}
	return 0
}

// requestError wraps a request's error: no answer or a 5xx is
// ErrUnavailable; anything else is the server refusing, with its message.
func (b *Backend) requestError(what string, err error) error {
	var me *meili.Error
	if errors.As(err, &me) && me.StatusCode >= 400 && me.StatusCode < 500 {
		return fmt.Errorf("%s: %s (HTTP %d): %s", what, me.APIError.Code, me.StatusCode, me.APIError.Message)
	}
	if errors.As(err, &me) && me.StatusCode >= 500 {
		return fmt.Errorf("%w: %s: HTTP %d %s", ErrUnavailable, what, me.StatusCode, me.APIError.Message)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}

// Query searches the index, adding the tenant filter for a tenant-owned
// index, and returns the hits without Projector's attributes.
func (b *Backend) Query(ctx context.Context, idx search.Index, q search.Request) ([]json.RawMessage, error) {
	f, err := filter(q.Tenant, q.Filters, !idx.Shared)
	if err != nil {
		return nil, err
	}
	req := &meili.SearchRequest{Limit: int64(q.Limit), Offset: int64(q.Offset)}
	if f != "" {
		req.Filter = f
	}
	for _, s := range q.Sort {
		dir := ":asc"
		if s.Desc {
			dir = ":desc"
		}
		req.Sort = append(req.Sort, s.Attr+dir)
	}
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	raw, err := b.client.Index(b.UID(idx)).SearchRaw(rctx, q.Text, req)
	if err != nil {
		return nil, b.requestError("search "+b.UID(idx), err)
	}
	var res struct {
		Hits []map[string]json.RawMessage `json:"hits"`
	}
	if err := json.Unmarshal(*raw, &res); err != nil {
		return nil, fmt.Errorf("decode search response: %w", err)
	}
	out := make([]json.RawMessage, len(res.Hits))
	for i, h := range res.Hits {
		delete(h, KeyAttr)
		delete(h, TenantAttr)
		if out[i], err = json.Marshal(h); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Documents lists every document of idx, ordered by tenant and id.
func (b *Backend) Documents(ctx context.Context, idx search.Index) ([]search.Stored, error) {
	var out []search.Stored
	err := b.EachDocument(ctx, idx, func(s search.Stored) error {
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b search.Stored) int { return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.ID, b.ID)) })
	return out, nil
}

// EachDocument hands every document of idx to fn, fetched 1,000 at a
// time, holding no more than one fetch: search.Verify pages with it.
func (b *Backend) EachDocument(ctx context.Context, idx search.Index, fn func(search.Stored) error) error {
	pk := cmp.Or(idx.PrimaryKey, search.DefaultPrimaryKey)
	for offset := int64(0); ; {
		var res meili.DocumentsResult
		rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
		err := b.client.Index(b.UID(idx)).GetDocuments(rctx, &meili.DocumentsQuery{Offset: offset, Limit: 1000}, &res)
		cancel()
		if err != nil {
			return b.requestError("list documents of "+b.UID(idx), err)
		}
		var docs []map[string]json.RawMessage
		if err := res.Results.DecodeWith(&docs, json.Marshal, json.Unmarshal); err != nil {
			return fmt.Errorf("decode documents: %w", err)
		}
		for _, d := range docs {
			var s search.Stored
			_ = json.Unmarshal(d[TenantAttr], &s.Tenant)
			if err := json.Unmarshal(d[pk], &s.ID); err != nil {
				s.ID = string(d[pk])
			}
			delete(d, KeyAttr)
			delete(d, TenantAttr)
			if s.Doc, err = json.Marshal(d); err != nil {
				return err
			}
			if err := fn(s); err != nil {
				return err
			}
		}
		offset += int64(len(docs))
		if len(docs) == 0 || offset >= res.Total {
			return nil
		}
	}
}
