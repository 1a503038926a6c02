package reaper

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/outbox"
)

// mysqlSettings are valid settings of a MySQL outbox, defaults applied.
func mysqlSettings() Settings {
	s := validConfig()
	s.Database = DatabaseMySQL
	s.DataSource = "harvester:secret@tcp(db:3306)/shop"
	s.ListenDataSource = ""
	return s
}

// A file that does not say database: means Postgres, as before the key existed.
func TestDatabaseDefaultsToPostgres(t *testing.T) {
	got := Settings{}.WithDefaults()
	if got.Database != DatabasePostgres {
		t.Errorf("Database = %q, want %q", got.Database, DatabasePostgres)
	}
	cfg, err := validConfig().HarvestConfig()
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Store.Dispose()
	if _, ok := cfg.Store.(*postgres.Store); !ok {
		t.Errorf("the default database made a %T, want a *postgres.Store", cfg.Store)
	}
}

// database: mysql makes the MySQL store, with the defaults of a store that has no notifications.
func TestMySQLSettings(t *testing.T) {
	in := Settings{Database: DatabaseMySQL, DataSource: "harvester:secret@tcp(db:3306)/shop"}
	in.Logger = slog.New(slog.DiscardHandler)
	got := in.WithDefaults()
	if got.OutboxTable != outbox.DefaultTable || got.ListenDataSource != "" || got.DataSource != in.DataSource {
		t.Errorf("defaults: outboxTable %q, listenDataSource %q, dataSource %q", got.OutboxTable, got.ListenDataSource, got.DataSource)
	}
	if got.Limits.MaxMarkBackoff != DefaultMySQLMaxMarkBackoff {
		t.Errorf("limits.maxMarkBackoff = %v, want %v for an outbox without notifications", got.Limits.MaxMarkBackoff, DefaultMySQLMaxMarkBackoff)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg, err := in.HarvestConfig()
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Store.Dispose()
	if _, ok := cfg.Store.(*mysql.Store); !ok {
		t.Errorf("database: mysql made a %T, want a *mysql.Store", cfg.Store)
	}
	if cfg.Limits.MaxMarkBackoff != DefaultMySQLMaxMarkBackoff {
		t.Errorf("the harvester's limits.maxMarkBackoff = %v, want %v", cfg.Limits.MaxMarkBackoff, DefaultMySQLMaxMarkBackoff)
	}

	// A maxMarkBackoff or markBackoff of the file's own is kept.
	in.Limits.MaxMarkBackoff = 3 * time.Second
	if got := in.WithDefaults().Limits.MaxMarkBackoff; got != 3*time.Second {
		t.Errorf("a configured maxMarkBackoff became %v", got)
	}
	in.Limits.MaxMarkBackoff, in.Limits.MarkBackoff = 0, 500*time.Millisecond
	if d := in.WithDefaults(); d.Limits.MaxMarkBackoff != 500*time.Millisecond || d.Validate() != nil {
		t.Errorf("markBackoff 500ms: maxMarkBackoff %v, %v", d.Limits.MaxMarkBackoff, d.Validate())
	}
	// A Postgres outbox keeps the engine's default.
	if got := validConfig().Limits.MaxMarkBackoff; got != time.Second {
		t.Errorf("a Postgres outbox's maxMarkBackoff = %v", got)
	}
}

func TestValidateMySQLNamesFieldAndKey(t *testing.T) {
	cases := []struct {
		name   string
		modify func(*Settings)
		want   []string
	}{
		{"unknown database", func(s *Settings) { s.Database = "mariadb" },
			[]string{`Database (database): "mariadb": must be "postgres" or "mysql"`}},
		{"listen data source", func(s *Settings) { s.ListenDataSource = "harvester@tcp(db:3306)/shop" },
			[]string{"ListenDataSource (listenDataSource)", "MySQL has no LISTEN", "remove it"}},
		{"no data source", func(s *Settings) { s.DataSource = "" },
			[]string{"DataSource (dataSource): required for database: mysql", "user:password@tcp(host:3306)/database"}},
		{"a Postgres data source", func(s *Settings) { s.DataSource = "host=db dbname=shop" },
			[]string{"DataSource (dataSource)", "user:password@tcp(host:3306)/database"}},
		{"no database", func(s *Settings) { s.DataSource = "harvester@tcp(db:3306)/" },
			[]string{"DataSource (dataSource)", "names no database", "outboxTable"}},
		{"autocommit off", func(s *Settings) { s.DataSource = "harvester@tcp(db:3306)/shop?autocommit=0" },
			[]string{"DataSource (dataSource)", "autocommit", "must stay on"}},
		{"bad table", func(s *Settings) { s.OutboxTable = "out`box" }, []string{"OutboxTable (outboxTable)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mysqlSettings()
			c.modify(&s)
			err := s.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := s.HarvestConfig(); err == nil {
				t.Error("HarvestConfig made a store of settings Validate refuses")
			}
		})
	}
	// A qualified table needs no database in the data source; every problem is reported at once.
	s := mysqlSettings()
	s.DataSource, s.OutboxTable = "harvester@tcp(db:3306)/", "shop.outbox"
	if err := s.Validate(); err != nil {
		t.Errorf("a qualified table without a database in the data source: %v", err)
	}
	s.ListenDataSource, s.DataSource = "x", "host=db"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "listenDataSource") || !strings.Contains(err.Error(), "DataSource (dataSource)") {
		t.Errorf("want both problems, got %v", err)
	}
}

// One file runs a Postgres outbox and a MySQL outbox side by side; the MySQL one inherits no
// listenDataSource that harvest: sets for the others unless it says so.
func TestLoadPostgresAndMySQLOutboxes(t *testing.T) {
	f, err := Load([]byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: k:9092
outboxes:
  - outbox: billing
    dataSource: host=db1 dbname=billing
  - outbox: orders
    database: mysql
    dataSource: harvester:${MYSQL_PASSWORD}@tcp(db2:3306)/shop
`), env(map[string]string{"MYSQL_PASSWORD": "pw"}))
	if err != nil {
		t.Fatal(err)
	}
	billing, orders := f.Outboxes[0].Harvest, f.Outboxes[1].Harvest
	billing.Logger, orders.Logger = slog.New(slog.DiscardHandler), slog.New(slog.DiscardHandler)
	if billing.WithDefaults().Database != DatabasePostgres || orders.Database != DatabaseMySQL || orders.DataSource != "harvester:pw@tcp(db2:3306)/shop" {
		t.Fatalf("billing %q, orders %q %q", billing.WithDefaults().Database, orders.Database, orders.DataSource)
	}
	for _, h := range []Settings{billing, orders} {
		cfg, err := h.HarvestConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Store.Dispose()
	}

	// database: in harvest: is every outbox's default; listenDataSource there reaches a MySQL
	// outbox, which refuses it, naming the key.
	f, err = Load([]byte(`harvest:
  database: mysql
  listenDataSource: host=db1 dbname=billing
outboxes:
  - outbox: orders
    dataSource: harvester@tcp(db2:3306)/shop
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Outboxes[0].Harvest.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "listenDataSource") {
		t.Errorf("a MySQL outbox took harvest:'s listenDataSource: %v", err)
	}
}

// Two MySQL outboxes on one table, however their data sources are written, are refused; a
// Postgres and a MySQL table of one name are not one table.
func TestMySQLOutboxesSharingATable(t *testing.T) {
	_, err := Load([]byte(`outboxes:
  - outbox: a
    database: mysql
    dataSource: harvester@tcp(db:3306)/shop
  - outbox: b
    database: mysql
    dataSource: other:pw@tcp(db:3306)/shop?timeout=5s
  - outbox: c
    dataSource: host=db dbname=shop
`), env(nil))
	if err == nil || !strings.Contains(err.Error(), `outbox "b"`) || !strings.Contains(err.Error(), "table") {
		t.Fatalf("want b refused for a's table, got %v", err)
	}
	if strings.Contains(err.Error(), `outbox "c"`) {
		t.Errorf("the Postgres outbox c was taken for the MySQL table: %v", err)
	}
}
