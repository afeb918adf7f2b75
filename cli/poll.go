package cli

import (
	"context"
	"time"
)

// poll calls look at once and then every interval until it reports done
// or fails, or ctx ends (its error, also when a look failed because ctx
// ended meanwhile): how the commands that wait for a dispatcher's work
// (`rebuild --wait`, `parked retry --wait`) follow its record.
func poll(ctx context.Context, every time.Duration, look func() (done bool, err error)) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		done, err := look()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
