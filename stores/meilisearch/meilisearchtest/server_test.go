package meilisearchtest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) } // the Example needs a database; Main checks for leaks too

func call(t *testing.T, client *http.Client, method, url string, body any) (int, map[string]any, error) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, nil
}

// waitTask polls GET /tasks/{uid} until the task finished and returns it.
func waitTask(t *testing.T, client *http.Client, base string, uid any) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, task, err := call(t, client, http.MethodGet, base+"/tasks/"+strconv.Itoa(int(uid.(float64))), nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("get task: %d %v", code, err)
		}
		if s := task["status"]; s == "succeeded" || s == "failed" {
			return task
		}
		if time.Now().After(deadline) {
			t.Fatalf("task still %v", task["status"])
		}
		time.Sleep(time.Millisecond) // polling, as clients of the real API do
	}
}

// TestDocumentedShapes: writes answer 202 with a summarized task that is
// later succeeded or failed with the documented error object; a missing
// index is a 404 with code index_not_found; documents replace or merge;
// 503 and refused connections happen on demand and end on demand.
func TestDocumentedShapes(t *testing.T) {
	s := meilisearchtest.New(t)
	client := &http.Client{Timeout: 5 * time.Second}
	base := s.URL()

	code, body, err := call(t, client, http.MethodGet, base+"/indexes/nope", nil)
	if err != nil || code != http.StatusNotFound || body["code"] != "index_not_found" || body["type"] != "invalid_request" || body["link"] == nil || body["message"] == nil {
		t.Fatalf("GET a missing index: %d %v %v", code, body, err)
	}
	code, body, err = call(t, client, http.MethodPost, base+"/indexes", map[string]string{"uid": "docs", "primaryKey": "id"})
	if err != nil || code != http.StatusAccepted || body["status"] != "enqueued" || body["taskUid"] == nil {
		t.Fatalf("create index: %d %v %v", code, body, err)
	}
	if task := waitTask(t, client, base, body["taskUid"]); task["status"] != "succeeded" || task["type"] != "indexCreation" {
		t.Fatalf("index creation task: %v", task)
	}
	_, body, _ = call(t, client, http.MethodPost, base+"/indexes/docs/documents", []map[string]any{{"id": "a", "x": 1, "y": 1}})
	waitTask(t, client, base, body["taskUid"])
	_, body, _ = call(t, client, http.MethodPut, base+"/indexes/docs/documents", []map[string]any{{"id": "a", "y": 2}})
	waitTask(t, client, base, body["taskUid"])
	if d := s.Documents("docs")["a"]; string(d["x"]) != "1" || string(d["y"]) != "2" {
		t.Fatalf("update merged %v, want x 1 and y 2", d)
	}
	_, body, _ = call(t, client, http.MethodPost, base+"/indexes/docs/documents", []map[string]any{{"id": "a", "y": 3}})
	waitTask(t, client, base, body["taskUid"])
	if d := s.Documents("docs")["a"]; d["x"] != nil {
		t.Fatalf("add replaced into %v, want no x", d)
	}

	s.FailTasks(1, "internal")
	_, body, _ = call(t, client, http.MethodPost, base+"/indexes/docs/documents", []map[string]any{{"id": "b"}})
	task := waitTask(t, client, base, body["taskUid"])
	e, _ := task["error"].(map[string]any)
	if task["status"] != "failed" || e["code"] != "internal" || e["type"] == nil || e["link"] == nil || e["message"] == nil {
		t.Fatalf("a failed task: %v", task)
	}
	if _, ok := s.Documents("docs")["b"]; ok {
		t.Fatal("a failed task wrote its document")
	}
	_, body, _ = call(t, client, http.MethodPost, base+"/indexes/docs/documents", []map[string]any{{"id": "bad id!"}})
	if task := waitTask(t, client, base, body["taskUid"]); task["error"].(map[string]any)["code"] != "invalid_document_id" {
		t.Fatalf("an invalid id: %v", task)
	}

	s.Unavailable(true)
	if code, _, err := call(t, client, http.MethodGet, base+"/indexes/docs", nil); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("unavailable: %d %v", code, err)
	}
	s.Unavailable(false)
	s.Down()
	if _, _, err := call(t, client, http.MethodGet, base+"/indexes/docs", nil); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("down: %v, want connection refused", err)
	}
	s.Up(t)
	if code, _, err := call(t, client, http.MethodGet, base+"/indexes/docs", nil); err != nil || code != http.StatusOK {
		t.Fatalf("up again: %d %v", code, err)
	}
	client.CloseIdleConnections()
}

// TestConfigFake: without MEILISEARCH_URL, Config starts a fake for the
// test, with a prefix of the test's own.
func TestConfigFake(t *testing.T) {
	t.Setenv(meilisearchtest.EnvURL, "")
	cfg, fake := meilisearchtest.Config(t)
	if fake == nil || cfg.URL != fake.URL() || cfg.IndexPrefix == "" {
		t.Fatalf("Config without %s: %+v, fake %v", meilisearchtest.EnvURL, cfg, fake)
	}
	other, _ := meilisearchtest.Config(t)
	if other.IndexPrefix == cfg.IndexPrefix {
		t.Errorf("two Configs share the prefix %s", cfg.IndexPrefix)
	}
}

// TestConfigRealServerCleansUp: with MEILISEARCH_URL set, Config points at
// that server (here a fake standing in for it) and deletes the indexes
// under the test's prefix when the test ends, and no other index.
func TestConfigRealServerCleansUp(t *testing.T) {
	server := meilisearchtest.New(t)
	t.Setenv(meilisearchtest.EnvURL, server.URL())
	t.Setenv(meilisearchtest.EnvAPIKey, "a-key")
	client := &http.Client{Timeout: 10 * time.Second}
	create := func(uid string) {
		t.Helper()
		code, out, err := call(t, client, http.MethodPost, server.URL()+"/indexes", map[string]string{"uid": uid, "primaryKey": "id"})
		if err != nil || code != http.StatusAccepted {
			t.Fatalf("create %s: %d %v", uid, code, err)
		}
		if task := waitTask(t, client, server.URL(), out["taskUid"]); task["status"] != "succeeded" {
			t.Fatalf("create %s: %v", uid, task)
		}
	}
	create("someone_elses")
	var prefix string
	t.Run("inner", func(t *testing.T) {
		cfg, fake := meilisearchtest.Config(t)
		if fake != nil || cfg.URL != server.URL() || cfg.APIKey != "a-key" {
			t.Fatalf("Config with %s: %+v, fake %v", meilisearchtest.EnvURL, cfg, fake)
		}
		prefix = cfg.IndexPrefix
		for i := range 3 {
			create(fmt.Sprintf("%sidx%d", prefix, i))
		}
	})
	for i := range 3 {
		if ok, _ := server.Index(fmt.Sprintf("%sidx%d", prefix, i)); ok {
			t.Errorf("index %sidx%d outlived its test", prefix, i)
		}
	}
	if ok, _ := server.Index("someone_elses"); !ok {
		t.Error("an index outside the test's prefix was deleted")
	}
}

// TestListIndexes: GET /indexes pages the indexes by uid, as documented.
func TestListIndexes(t *testing.T) {
	t.Parallel()
	s := meilisearchtest.New(t)
	client := &http.Client{Timeout: 10 * time.Second}
	for _, uid := range []string{"b", "a", "c"} {
		_, out, err := call(t, client, http.MethodPost, s.URL()+"/indexes", map[string]string{"uid": uid})
		if err != nil {
			t.Fatal(err)
		}
		waitTask(t, client, s.URL(), out["taskUid"])
	}
	code, out, err := call(t, client, http.MethodGet, s.URL()+"/indexes?offset=1&limit=1", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("list: %d %v", code, err)
	}
	res, _ := out["results"].([]any)
	if out["total"] != float64(3) || len(res) != 1 || res[0].(map[string]any)["uid"] != "b" {
		t.Errorf("GET /indexes?offset=1&limit=1: %v", out)
	}
	if code, _, _ := call(t, client, http.MethodGet, s.URL()+"/indexes?limit=-1", nil); code != http.StatusBadRequest {
		t.Errorf("limit=-1: %d, want 400", code)
	}
}
