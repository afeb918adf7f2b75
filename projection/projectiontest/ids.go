package projectiontest

import (
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// specSeqs counts the deterministic specs each running test has started,
// so the second spec of a test does not remake the first one's ids: on
// PostgreSQL, a read model keyed by event id would make it wait on the
// first spec's uncommitted row until its batch timed out.
var specSeqs = struct {
	sync.Mutex
	n map[any]int
}{n: map[any]int{}}

// deterministicKey names a deterministic spec among all others: the test
// function's package (two packages' tests of the same name share one
// database), the test's name, and the spec's number among the
// deterministic specs of this run of the test. The number counts per
// testing.TB, not per name, so a test run again (-count) makes the same
// ids again.
func deterministicKey(t testing.TB) string {
	var key any = t
	if !reflect.TypeOf(t).Comparable() {
		key = t.Name()
	}
	specSeqs.Lock()
	specSeqs.n[key]++
	seq := specSeqs.n[key]
	specSeqs.Unlock()
	if seq == 1 {
		t.Cleanup(func() {
			specSeqs.Lock()
			delete(specSeqs.n, key)
			specSeqs.Unlock()
		})
	}
	return testPackage() + "\x00" + t.Name() + "\x00" + strconv.Itoa(seq)
}

// testPackage is the import path of the test function running: the
// outermost frame of the goroutine that is neither the runtime's nor the
// testing package's nor the generated test main's. It is the test's own
// package even when a helper package starts the spec, and the same on
// every run and machine, unlike a directory or a random salt.
func testPackage() string {
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	pkg := ""
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		switch p := funcPackage(f.Function); p {
		case "", "runtime", "testing", "main":
		default:
			pkg = p
		}
		if !more {
			return pkg
		}
	}
}

// funcPackage is the import path in a function's symbol name, as
// "example.com/app/orders" in "example.com/app/orders.TestX.func1" (the
// runtime escapes dots in a path's last element, so the first dot after
// the last slash ends the path).
func funcPackage(fn string) string {
	slash := strings.LastIndexByte(fn, '/')
	dot := strings.IndexByte(fn[slash+1:], '.')
	if dot < 0 {
		return ""
	}
	return fn[:slash+1+dot]
}
