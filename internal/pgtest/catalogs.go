package pgtest

import (
	"context"
	"sync/atomic"
	"time"
)

// catalogVacuumEvery is how many schema drops of a test binary pass
// between two vacuums of the catalogs they churn.
const catalogVacuumEvery = 40

// churnedCatalogs are the catalogs a test schema's creation and drop leave
// dead rows in: about 4,000 a schema (its ~135 relations, their columns,
// types, dependencies and constraints).
const churnedCatalogs = `pg_catalog.pg_attribute, pg_catalog.pg_depend, pg_catalog.pg_class,
	pg_catalog.pg_type, pg_catalog.pg_constraint, pg_catalog.pg_index, pg_catalog.pg_attrdef`

// drops counts this binary's schema drops.
var drops atomic.Int64

// afterDrop vacuums the churned catalogs every catalogVacuumEvery drops.
// A server with autovacuum off (this machine's, and CI's) never reclaims
// those rows: after a day of suites pg_attribute held 3.1 million dead
// rows in 650 MB, and a schema took 210-345 ms to migrate against 150-180
// once they were gone (BenchmarkSchemaCost), so every test paid more the
// longer the server had run. A plain VACUUM takes no lock DDL waits for,
// so it runs beside the other tests; a role that may not vacuum the
// catalogs only gets a warning, and any failure is the suite's speed, not
// its result, so it is ignored.
func afterDrop() {
	if drops.Add(1)%catalogVacuumEvery != 0 || shared.pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = shared.pool.Exec(ctx, `VACUUM `+churnedCatalogs)
}
