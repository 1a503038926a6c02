package outbox

// A table's name comes from configuration, so it is checked and quoted, never pasted into SQL.

import (
	"fmt"
	"strings"
)

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1; longer names are silently truncated by the
// server, so two different configured names could refer to one table.
const maxIdentifierLen = 63

// QuoteTable checks that name is a Postgres table name, optionally qualified by a schema ("outbox" or
// "app.outbox"), whose parts are plain identifiers: a letter or underscore followed by letters,
// digits, underscores or dollar signs, at most 63 bytes each. It returns the name quoted for SQL.
// The name is used exactly as written: it is quoted, so its case matters.
func QuoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("table name %q: at most one dot, between schema and table", name)
	}
	for _, part := range parts {
		if err := checkIdentifier(part); err != nil {
			return "", fmt.Errorf("table name %q: %w", name, err)
		}
	}
	return quote(parts), nil
}

// QuoteTableMySQL checks name as QuoteTable does, and quotes it for MySQL and MariaDB, where a
// database takes the place of the schema ("shop.outbox"). A checked name holds only letters,
// digits, underscores and dollar signs, none of which a backtick-quoted identifier must escape,
// so Postgres's double quotes simply become backticks; and 63 bytes are within MySQL's 64.
func QuoteTableMySQL(name string) (string, error) {
	quoted, err := QuoteTable(name)
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(quoted, `"`, "`"), nil
}

// quoteName quotes identifiers that QuoteTable would accept as parts of a table name (or names
// made of such parts and more of the same characters), joined with dots. It panics on any other:
// such a name comes from a programming error, not from configuration.
func quoteName(parts ...string) string {
	for _, part := range parts {
		if err := checkIdentifier(part); err != nil {
			panic(fmt.Sprintf("outbox.quoteName: %v", err))
		}
	}
	return quote(parts)
}

// quote quotes checked identifiers. A checked identifier holds no quote mark and no NUL, the
// only characters that quoting would have to escape, so wrapping each part is enough; this keeps
// the package, which writers import, free of any database driver.
func quote(parts []string) string {
	return `"` + strings.Join(parts, `"."`) + `"`
}

func checkIdentifier(s string) error {
	if s == "" {
		return fmt.Errorf("empty identifier")
	}
	if len(s) > maxIdentifierLen {
		return fmt.Errorf("identifier %q is longer than %d bytes", s, maxIdentifierLen)
	}
	for i, r := range s {
		letter := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if letter || (i > 0 && (r == '$' || (r >= '0' && r <= '9'))) {
			continue
		}
		return fmt.Errorf("identifier %q: character %q at byte %d is not allowed", s, r, i)
	}
	return nil
}
