package postgres

// PositionColumns lets the external tests compare the repair's list of
// stored transaction ids with the schema's xid8 columns.
var PositionColumns = positionColumns
