package driver

import (
	"errors"
	"slices"
	"testing"
)

// CheckColumns names each column missing and each of a type the store cannot read, and nothing
// else; a table that has what the store reads, and more, passes.
func TestCheckColumns(t *testing.T) {
	want := []Column{{Name: "id", Types: []string{"bigint"}}, {Name: "key", Types: []string{"text", "bytea"}}, {Name: "value", Types: []string{"text"}}}
	if err := CheckColumns("t", map[string]string{"id": "bigint", "key": "bytea", "value": "text", "extra": "int"}, want); err != nil {
		t.Errorf("a table with every column: %v", err)
	}
	err := CheckColumns("t", map[string]string{"id": "integer", "key": "text"}, want)
	var schemaErr *SchemaError
	if !errors.As(err, &schemaErr) || schemaErr.Table != "t" || !slices.Equal(schemaErr.Problems, []string{
		"column id has type integer; goharvest reads it as bigint",
		"column value is missing",
	}) {
		t.Errorf("a table with id of another type and no value: %#v", err)
	}
}
