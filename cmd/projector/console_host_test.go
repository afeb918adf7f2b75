package main_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// getHost sends GET url with the Host header host and returns the status
// and the first line of the body (the live tail streams forever).
func getHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	return resp.StatusCode, line
}

// TestRunConsoleRefusesHostileHost: the console `run` serves, its live
// tail, and on a loopback address its metrics and probes, answer a Host
// naming another site (DNS rebinding) 421; the names given with
// --console-allowed-hosts, localhost and the address are served.
func TestRunConsoleRefusesHostileHost(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	cmd, addr, _ := o.startRun("--console-allowed-hosts", "ops.example.com,*.console.example.net")
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	_, port, _ := strings.Cut(addr, ":")
	// The metrics and probes too, on this loopback listener: before, they
	// answered any Host.
	// "/" redirects to the console for a Host the console answers, and
	// answered any Host with that 302 (an HTTP audit).
	for _, path := range []string{"/", "/console/", "/console/state.json", "/console/tail?tenant=acme", "/console/static/console.js", "/console/login", "/metrics", "/healthz", "/readyz"} {
		for _, host := range []string{"rebind.evil.example:" + port, "ops.example.com.evil.example"} {
			if code, line := getHost(t, "http://"+addr+path, host); code != http.StatusMisdirectedRequest {
				t.Errorf("GET %s with Host %s: %d %q, want 421", path, host, code, line)
			}
		}
		for _, host := range []string{addr, "localhost:" + port, "ops.example.com:" + port, "a.console.example.net"} {
			if code, line := getHost(t, "http://"+addr+path, host); code != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d %q, want 200", path, host, code, line)
			}
		}
	}
}

// A bad --console-allowed-hosts is a bad command line (exit 2), and a
// short token's error says "console" once.
func TestRunConsoleFlagsExitTwo(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	wantError(t, run(t, o.env, "run", "--http-addr", "127.0.0.1:0", "--console-allowed-hosts", "ops.example.com:443"), 2, "--console-allowed-hosts")
	env := append([]string{"PROJECTOR_CONSOLE_TOKEN=short"}, o.env...)
	r := run(t, env, "run", "--http-addr", "127.0.0.1:0", "--instance-id", "token-test")
	wantError(t, r, 2, "console: invalid configuration: the token has 5 characters")
	if strings.Contains(r.stderr, "console: console:") {
		t.Errorf("the short token's error repeats itself: %q", r.stderr)
	}
}
