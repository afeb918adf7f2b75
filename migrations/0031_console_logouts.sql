-- Console logouts that every console process sees (docs/console.md,
-- "Security"). A session is a signed cookie, valid until it expires; a
-- logout clears the browser's copy, and a copy kept elsewhere (another
-- tab's request in flight, a proxy's log) must no longer sign in. Each
-- process kept the sessions logged out through it in memory, so behind one
-- address another console process accepted the session until it expired.
-- A logout now writes its session here too, and every console process
-- refuses a session found here: by a SHA-256 of the cookie's MAC (not the
-- MAC itself), until the session's expiry, after which logouts delete it.
CREATE TABLE IF NOT EXISTS {{schema}}.projector_console_logouts (
    session   text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
