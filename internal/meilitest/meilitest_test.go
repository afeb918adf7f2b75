package meilitest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectorhq/projector/internal/meilitest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	s := meilitest.New(t)
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
