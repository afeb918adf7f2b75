package pgtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

const parentDeathEnv = "PGTEST_PARENT_DEATH"

// parentDeathChild runs this binary's part in TestDieWithParentKillsTheChild
// when it was started for it: "middle" starts a "leaf" with DieWithParent,
// prints the leaf's pid and waits to be killed; "leaf" waits for ever.
func parentDeathChild() bool {
	switch os.Getenv(parentDeathEnv) {
	case "middle":
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), parentDeathEnv+"=leaf")
		DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		select {}
	case "leaf":
		select {}
	}
	return false
}

// A child started with DieWithParent dies with the process that started
// it, even when that process is SIGKILLed and runs no cleanup: the case of
// a test binary killed by `go test -timeout`, whose children used to run
// on, holding connections and applying events into dropped schemas.
func TestDieWithParentKillsTheChild(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("no parent-death signal on " + runtime.GOOS)
	}
	middle := exec.Command(os.Args[0], "-test.run=^$")
	middle.Env = append(os.Environ(), parentDeathEnv+"=middle")
	DieWithParent(middle)
	out, err := middle.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := middle.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = middle.Process.Kill()
		t.Fatalf("middle process: %v", err)
	}
	leaf, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		_ = middle.Process.Kill()
		t.Fatalf("middle process printed %q, want the leaf's pid", line)
	}
	if !alive(leaf) {
		t.Fatalf("leaf %d is not running before its parent is killed", leaf)
	}
	if err := middle.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = middle.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for alive(leaf) {
		if time.Now().After(deadline) {
			_ = syscallKill(leaf)
			t.Fatalf("leaf %d still runs 30s after its parent was SIGKILLed", leaf)
		}
		time.Sleep(10 * time.Millisecond) // polling /proc: the leaf is no child of ours to wait for
	}
}

// alive reports whether pid runs: present in /proc and not a zombie
// waiting for its new parent to reap it.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func syscallKill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
