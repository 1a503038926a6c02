package reaper

import (
	"os"
	"strings"
	"testing"
)

// The reaper.yaml that examples/mysqlstasher's doc comment shows (the indented block from
// "harvest:" to the next blank comment line) loads and validates as a MySQL outbox, its password
// taken from the environment.
func TestMySQLStasherExampleConfigLoadsAndValidates(t *testing.T) {
	src, err := os.ReadFile("../../../examples/mysqlstasher/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, found := strings.Cut(string(src), "//\tharvest:\n")
	block, _, _ = strings.Cut(block, "//\n")
	if !found || block == "" {
		t.Fatal("examples/mysqlstasher/main.go's doc comment shows no reaper.yaml starting with harvest:")
	}
	yaml := "harvest:\n" + strings.ReplaceAll(block, "//\t", "")
	f, err := Load([]byte(yaml), env(map[string]string{"MYSQL_PASSWORD": "pw"}))
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	if len(f.Outboxes) != 1 {
		t.Fatalf("%d outboxes, want 1\n%s", len(f.Outboxes), yaml)
	}
	h := f.Outboxes[0].Harvest.WithDefaults()
	if err := h.Validate(); err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	if h.Database != DatabaseMySQL || h.DataSource != "root:pw@tcp(localhost:3306)/shop" {
		t.Errorf("database %q, dataSource %q; want mysql, root:pw@tcp(localhost:3306)/shop\n%s", h.Database, h.DataSource, yaml)
	}
}
