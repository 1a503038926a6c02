package outbox

import (
	"strings"
	"testing"
)

func TestQuoteTable(t *testing.T) {
	good := map[string]string{
		"outbox":                `"outbox"`,
		"app.outbox":            `"app"."outbox"`,
		"Outbox_2":              `"Outbox_2"`,
		"_x$":                   `"_x$"`,
		strings.Repeat("a", 63): `"` + strings.Repeat("a", 63) + `"`,
	}
	for in, want := range good {
		got, err := QuoteTable(in)
		if err != nil || got != want {
			t.Errorf("QuoteTable(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                         "empty identifier",
		"a.b.c":                    "at most one dot",
		"outbox; DROP TABLE users": "not allowed",
		`out"box`:                  "not allowed",
		"1outbox":                  "not allowed",
		"app.":                     "empty identifier",
		strings.Repeat("a", 64):    "longer than 63",
		"out box":                  "not allowed",
	}
	for in, want := range bad {
		_, err := QuoteTable(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("QuoteTable(%q) error = %v; want one containing %q", in, err, want)
		}
	}
}

func TestQuoteName(t *testing.T) {
	if got := quoteName("app", "goharvest_notify"); got != `"app"."goharvest_notify"` {
		t.Errorf("Quote = %s", got)
	}
	defer func() {
		if recover() == nil {
			t.Error(`quoteName("out\"box") did not panic`)
		}
	}()
	quoteName(`out"box`)
}

// MySQL's quoting accepts and refuses the names Postgres's does, with backticks for quotes.
func TestQuoteTableMySQL(t *testing.T) {
	for name, want := range map[string]string{"outbox": "`outbox`", "shop.Out_box$1": "`shop`.`Out_box$1`"} {
		if got, err := QuoteTableMySQL(name); err != nil || got != want {
			t.Errorf("QuoteTableMySQL(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"a.b.c", "out`box", "x; DROP TABLE y", ""} {
		if got, err := QuoteTableMySQL(name); err == nil {
			t.Errorf("QuoteTableMySQL(%q) = %q, want an error", name, got)
		}
	}
}
