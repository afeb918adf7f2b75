package projectiontest

import "testing"

// Deterministic ids are keyed by the test's package, found on the stack:
// the test function's, from the test itself, a goroutine it starts, or a
// subtest.
func TestTestPackage(t *testing.T) {
	t.Parallel()
	const want = "github.com/projectorhq/projector/projection/projectiontest"
	if got := testPackage(); got != want {
		t.Errorf("in the test: %q, want %q", got, want)
	}
	got := make(chan string)
	go func() { got <- testPackage() }()
	if got := <-got; got != want {
		t.Errorf("in a goroutine of the test: %q, want %q", got, want)
	}
	t.Run("sub", func(t *testing.T) {
		if got := testPackage(); got != want {
			t.Errorf("in a subtest: %q, want %q", got, want)
		}
	})
}

func TestFuncPackage(t *testing.T) {
	t.Parallel()
	for fn, want := range map[string]string{
		"example.com/app/orders.TestX.func1":      "example.com/app/orders",
		"example.com/app/orders_test.TestX":       "example.com/app/orders_test",
		"gopkg.in/yaml%2ev3.(*decoder).unmarshal": "gopkg.in/yaml%2ev3",
		"example.com/app.Run[...]":                "example.com/app",
		"testing.tRunner":                         "testing",
		"main.main":                               "main",
		"":                                        "",
	} {
		if got := funcPackage(fn); got != want {
			t.Errorf("funcPackage(%q) = %q, want %q", fn, got, want)
		}
	}
}
