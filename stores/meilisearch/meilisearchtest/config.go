package meilisearchtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/stores/meilisearch"
)

// EnvURL and EnvAPIKey name the real server [Config] uses when EnvURL is
// set: the same variables [meilisearch.New] reads.
const (
	EnvURL    = "MEILISEARCH_URL"
	EnvAPIKey = "MEILISEARCH_API_KEY"
)

// Config returns a backend configuration for one test: the real server at
// $MEILISEARCH_URL (with $MEILISEARCH_API_KEY) when that is set, else a new
// fake started for t (returned, nil on a real server). The IndexPrefix is
// unique to the test, so tests may run in parallel on one server; on a real
// server the test's indexes are deleted when it ends. Fill in the other
// fields (PollInterval, TaskTimeout) before [meilisearch.New].
func Config(t testing.TB) (meilisearch.Config, *Server) {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("meilisearchtest: %v", err)
	}
	prefix := "test_" + hex.EncodeToString(b[:]) + "_"
	if u := os.Getenv(EnvURL); u != "" {
		cfg := meilisearch.Config{URL: u, APIKey: os.Getenv(EnvAPIKey), IndexPrefix: prefix}
		t.Cleanup(func() {
			if err := deleteIndexes(cfg); err != nil {
				t.Errorf("meilisearchtest: delete the test's indexes (prefix %s): %v", prefix, err)
			}
		})
		return cfg, nil
	}
	s := New(t)
	return meilisearch.Config{URL: s.URL(), IndexPrefix: prefix}, s
}

// deleteIndexes deletes the indexes whose uids start with cfg.IndexPrefix
// and waits for the deletions (GET /indexes, DELETE /indexes/{uid}, GET
// /tasks/{uid} of the reference).
func deleteIndexes(cfg meilisearch.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := strings.TrimSuffix(cfg.URL, "/")
	call := func(method, path string, out any) error {
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		if err != nil {
			return err
		}
		if cfg.APIKey != "" {
			req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s %s: %s", method, path, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(out)
	}
	var uids []string
	for offset := 0; ; offset += 100 {
		var page struct {
			Results []struct {
				UID string `json:"uid"`
			} `json:"results"`
			Total int `json:"total"`
		}
		if err := call(http.MethodGet, fmt.Sprintf("/indexes?offset=%d&limit=100", offset), &page); err != nil {
			return err
		}
		for _, r := range page.Results {
			if strings.HasPrefix(r.UID, cfg.IndexPrefix) {
				uids = append(uids, r.UID)
			}
		}
		if len(page.Results) == 0 || offset+100 >= page.Total {
			break
		}
	}
	for _, uid := range uids {
		var task struct {
			TaskUID int64 `json:"taskUid"`
		}
		if err := call(http.MethodDelete, "/indexes/"+url.PathEscape(uid), &task); err != nil {
			return err
		}
		for {
			var st struct {
				Status string `json:"status"`
			}
			if err := call(http.MethodGet, fmt.Sprintf("/tasks/%d", task.TaskUID), &st); err != nil {
				return err
			}
			if st.Status == "succeeded" || st.Status == "failed" || st.Status == "canceled" {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("delete index %s: %w", uid, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}
