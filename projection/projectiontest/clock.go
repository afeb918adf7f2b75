package projectiontest

import (
	"sync"
	"time"
)

// Start is where a new [Clock] starts unless told otherwise: a fixed
// instant, so specs that print or store times print the same thing on
// every run.
var Start = time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)

// Clock is a test's time: it moves only when the test moves it. One clock
// can drive a projection spec (the RecordedAt of the events it makes), a
// saga fixture (package sagatest: the time its handlers see and when its
// timeouts fall due) and the application code under test (pass
// [Clock.Now] where a func() time.Time is taken), so they all agree on
// what time it is. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading at.
func NewClock(at time.Time) *Clock { return &Clock{now: at} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time. A
// negative d panics: time in a test goes one way, as it does in
// production, and a clock that went back would hide the bugs a spec is
// there to find.
func (c *Clock) Advance(d time.Duration) time.Time {
	if d < 0 {
		panic("projectiontest: Clock.Advance with a negative duration")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// Set moves the clock to at, which must not be before its time (see
// [Clock.Advance]).
func (c *Clock) Set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.Before(c.now) {
		panic("projectiontest: Clock.Set to an earlier time")
	}
	c.now = at
}
