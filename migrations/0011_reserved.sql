-- Placeholder: number 0011 is reserved for another branch's migration
-- (the ops work). It exists only so that 0012 follows a contiguous run on
-- the search branch; whoever merges the branch that owns 0011 replaces this
-- file with that one. It changes nothing.
SELECT FROM {{schema}}.projector_events WHERE false;
