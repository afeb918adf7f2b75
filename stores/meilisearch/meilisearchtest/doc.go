// Package meilisearchtest tests search projections on Meilisearch without a
// Meilisearch server: an in-process fake of the parts of Meilisearch's HTTP
// API that package meilisearch uses, and [Config], which points a test at a
// real server instead when MEILISEARCH_URL is set.
//
//	fake := meilisearchtest.New(t) // stopped when the test ends
//	backend, err := meilisearch.New(meilisearch.Config{URL: fake.URL()})
//
// It is a test double, not a search engine: documents live in maps, a
// search matches query words as prefixes of the searchable attributes'
// words (no typo tolerance, no ranking rules beyond sort), and filters are
// the `attr = value [AND …]` form the backend writes. Test what your
// projection writes (the documents, the tenant filter, a search that finds
// them), not Meilisearch's relevance; run the same tests against a real
// server too when you can (MEILISEARCH_URL, [Config]).
//
// # What it keeps faithfully
//
// What the backend's correctness rests on, following the API reference
// (https://www.meilisearch.com/docs/reference/api):
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
//     (/docs/reference/api/indexes#swap-indexes);
//   - indexes are listed in pages of offset and limit
//     (/docs/reference/api/indexes#list-all-indexes).
//
// # Making it fail
//
// [Server.FailTasks] fails the next document tasks with an error object
// and [Server.FailDocuments] every task holding a matching document (a
// poison event), [Server.Unavailable] answers 503, [Server.Refuse] answers
// 503 to one kind of request, [Server.SetDelay] slows every response, and
// [Server.Down] / [Server.Up] close and reopen its port (connection refused
// in between). [Server.Documents], [Server.Index] and [Server.Requests]
// show what the backend did.
package meilisearchtest
