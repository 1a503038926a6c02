package mysql_test

import (
	"os"
	"strings"
	"testing"

	"github.com/goharvest/goharvest/driver/mysql"
)

// docs/mysql.md shows the outbox's DDL; it is TableDDL's, word for word, so that a user who
// creates the table by hand creates the one the store reads.
func TestDocsShowTheTableDDL(t *testing.T) {
	page, err := os.ReadFile("../../docs/mysql.md")
	if err != nil {
		t.Fatal(err)
	}
	ddl, err := mysql.TableDDL("outbox")
	if err != nil {
		t.Fatal(err)
	}
	want := "```sql\n" + strings.Join(ddl, ";\n\n") + ";\n```\n"
	if !strings.Contains(string(page), want) {
		t.Errorf("docs/mysql.md does not show mysql.TableDDL(\"outbox\") as a block of its own; it should show:\n%s", want)
	}
}
