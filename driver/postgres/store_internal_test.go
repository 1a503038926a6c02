package postgres

import "testing"

// The binding keeps a default_query_exec_mode the data source names, and only then.
func TestExecModeSet(t *testing.T) {
	for dsn, want := range map[string]bool{
		"host=db dbname=app":                                             false,
		"host=db default_query_exec_mode=cache_statement":                true,
		"default_query_exec_mode = exec host=db":                         true,
		"postgres://db/app?default_query_exec_mode=exec":                 true,
		"postgres://db/app?sslmode=disable&default_query_exec_mode=exec": true,
		"host=db password=default_query_exec_mode=x":                     false,
	} {
		if got := execModeSet.MatchString(dsn); got != want {
			t.Errorf("%q: %v, want %v", dsn, got, want)
		}
	}
}
