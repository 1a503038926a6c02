package reaper

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/goharvest/goharvest"
)

// RunbookBase is where each alert's runbook_url points: the section of docs/monitoring.md for
// that alert, whose heading is the alert's name.
const RunbookBase = "https://github.com/goharvest/goharvest/blob/main/docs/monitoring.md#"

// DefaultSustained is how long trouble that may pass by itself (errors, failing readiness) must
// last before an alert fires, unless reaper rules -sustained says otherwise.
const DefaultSustained = 2 * time.Minute

// RuleGroups is a Prometheus rule file (and the spec of a PrometheusRule).
type RuleGroups struct {
	Groups []RuleGroup `yaml:"groups" json:"groups"`
}

type RuleGroup struct {
	Name  string `yaml:"name" json:"name"`
	Rules []Rule `yaml:"rules" json:"rules"`
}

// Rule is a recording rule (Record set) or an alerting rule (Alert set).
type Rule struct {
	Record      string            `yaml:"record,omitempty" json:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty" json:"alert,omitempty"`
	Expr        string            `yaml:"expr" json:"expr"`
	For         string            `yaml:"for,omitempty" json:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty" json:"annotations,omitempty"`
}

// withGroup gives a goharvest series the label group (the reapers' leaderGroupID) from
// goharvest_reaper_info of the same reaper: harvest names one reaper, the group is what the
// reapers of one outbox share, and the rules judge an outbox as a whole.
const withGroup = ` * on(job, instance, harvest) group_left(group) goharvest_reaper_info`

// shardLeaders is the recording rule the leadership alerts share: per group and shard, how many
// reapers say they publish it.
const shardLeaders = "goharvest:shard_leaders:sum"

// AlertRules returns the alerting rules for reapers configured as h (with its defaults
// applied). The thresholds that depend on the reapers' timing are derived from it, and each
// alert's description says how; sustained is how long errors or failing readiness must last.
func AlertRules(h goharvest.Config, sustained time.Duration) RuleGroups {
	l := h.Limits
	hb := l.HeartbeatTimeout
	election := 4 * hb
	ledTwiceFor := sustained + 2*hb
	heldAge := 60 * l.HeldCheckInterval
	oldestAge := max(5*time.Minute, 2*l.QueueTimeout+2*l.BacklogSampleInterval)
	growth := max(sustained, 6*l.BacklogSampleInterval)
	rate := sustained / 2
	const deadLetterWindow, restartWindow = 10 * time.Minute, 15 * time.Minute

	alert := func(name, severity, expr string, forDur time.Duration, summary, description string) Rule {
		r := Rule{Alert: name, Expr: expr, Labels: map[string]string{"severity": severity},
			Annotations: map[string]string{
				"summary":     summary,
				"description": description,
				"runbook_url": RunbookBase + strings.ToLower(name),
			}}
		if forDur > 0 {
			r.For = promDuration(forDur)
		}
		return r
	}
	d := promDuration
	rules := []Rule{
		{Record: shardLeaders, Expr: "sum by (group, shard) (goharvest_shard_leader" + withGroup + ")"},
		alert("GoharvestShardUnled", "critical",
			fmt.Sprintf("%s == 0\nor on(group, shard)\n(max_over_time(%s[1d]) unless on(group, shard) %s)", shardLeaders, shardLeaders, shardLeaders),
			election,
			"Shard {{ $labels.shard }} of {{ $labels.group }} has no leader: nothing of it is published",
			fmt.Sprintf("No reaper of the group publishes this shard (or none reports it at all), for longer than an election needs: "+
				"4 x heartbeatTimeout (%s), twice the Kafka session timeout a killed leader's successor waits out.", d(hb))),
		alert("GoharvestShardLedTwice", "warning",
			shardLeaders+" > 1",
			ledTwiceFor,
			"Shard {{ $labels.shard }} of {{ $labels.group }} is reported led by {{ $value }} reapers",
			fmt.Sprintf("More than one reaper says it publishes this shard, for longer than scrape skew and a handover explain: "+
				"the sustained time (%s) plus the session timeout, 2 x heartbeatTimeout (%s).", d(sustained), d(hb))),
		alert("GoharvestOldestRecordTooOld", "critical",
			fmt.Sprintf("max by (group) ((goharvest_outbox_oldest_record_age_seconds%s) and on(job, instance, harvest) goharvest_leader > 0) > %g",
				withGroup, oldestAge.Seconds()),
			l.BacklogSampleInterval,
			"The oldest record in the outbox of {{ $labels.group }} is {{ $value | humanizeDuration }} old",
			fmt.Sprintf("A record waits longer than max(5m, 2 x queueTimeout (%s) + 2 x backlogSampleInterval (%s)) = %s: "+
				"longer than two delivery attempts and two samples of the age take.", d(l.QueueTimeout), d(l.BacklogSampleInterval), d(oldestAge))),
		alert("GoharvestBacklogGrowing", "critical",
			fmt.Sprintf("(max by (group) (delta(goharvest_outbox_backlog_records[%s])%s) > 0)\nand on(group)\n"+
				"(sum by (group) (increase(goharvest_records_published_total[%s])%s) == 0)", d(growth), withGroup, d(growth), withGroup),
			growth,
			"The outbox of {{ $labels.group }} grows while nothing is published",
			fmt.Sprintf("The leader's backlog grew over max(sustained %s, 6 x backlogSampleInterval (%s)) = %s, and no reaper of the group published a record in that time.",
				d(sustained), d(l.BacklogSampleInterval), d(growth))),
		alert("GoharvestHeldRecordTooOld", "warning",
			fmt.Sprintf("max by (group, harvest) (goharvest_held_record_oldest_age_seconds%s) > %g", withGroup, heldAge.Seconds()),
			0,
			"A record held back in {{ $labels.group }} has failed for {{ $value | humanizeDuration }}",
			fmt.Sprintf("A record that cannot be published has held back its key for more than 60 x heldCheckInterval (%s) = %s: "+
				"its row was read afresh 60 times and is still refused.", d(l.HeldCheckInterval), d(heldAge))),
		alert("GoharvestDeadLetters", "warning",
			fmt.Sprintf("sum by (group) (increase(goharvest_records_dead_lettered_total[%s])%s) > 0", d(deadLetterWindow), withGroup),
			0,
			"Records of {{ $labels.group }} were moved to the dead-letter table",
			fmt.Sprintf("At least one held record was moved into the dead-letter table in the last %s: it was not published, and its key's later records went without it.",
				d(deadLetterWindow))),
		alert("GoharvestDatabaseErrors", "warning",
			fmt.Sprintf(`sum by (group, harvest) (rate(goharvest_errors_total{kind="database"}[%s])%s) > 0`, d(rate), withGroup),
			sustained,
			"Reaper {{ $labels.harvest }} of {{ $labels.group }} keeps failing database operations",
			fmt.Sprintf("Database operations failed in every %s for %s (the sustained time).", d(rate), d(sustained))),
		alert("GoharvestKafkaErrors", "warning",
			fmt.Sprintf(`sum by (group, harvest) (rate(goharvest_errors_total{kind="kafka"}[%s])%s) > 0`, d(rate), withGroup),
			sustained,
			"Reaper {{ $labels.harvest }} of {{ $labels.group }} keeps failing Kafka transactions",
			fmt.Sprintf("Kafka transactions failed in every %s for %s (the sustained time).", d(rate), d(sustained))),
		alert("GoharvestNotReady", "warning",
			"goharvest_reaper_ready"+withGroup+" == 0",
			sustained,
			"Reaper {{ $labels.harvest }} of {{ $labels.group }} is not ready",
			fmt.Sprintf("Its /readyz has failed for %s (the sustained time): it cannot reach its database or Kafka, or as the elected leader it cannot publish.", d(sustained))),
		alert("GoharvestReaperRestarting", "warning",
			fmt.Sprintf("changes(process_start_time_seconds[%s]) * on(job, instance) group_left(group) max by (job, instance, group) (goharvest_reaper_info) >= 3",
				d(restartWindow)),
			0,
			"The reaper at {{ $labels.instance }} ({{ $labels.group }}) restarted {{ $value }} times in 15 minutes",
			"The process started three times or more within 15 minutes: it keeps crashing, failing its liveness probe, or being killed."),
	}
	return RuleGroups{Groups: []RuleGroup{{Name: "goharvest", Rules: rules}}}
}

// RulesFile renders rules as a rule file that says what it was derived from.
func RulesFile(h goharvest.Config, sustained time.Duration) []byte {
	var b bytes.Buffer
	l := h.Limits
	fmt.Fprintf(&b, `# goharvest's alerting rules, made by reaper rules (see docs/monitoring.md).
# Thresholds that depend on the reapers' timing are derived from these settings; for others,
# regenerate: reaper rules -f reaper.yaml [-sustained 2m] > goharvest-rules.yaml
#   heartbeatTimeout: %s   heldCheckInterval: %s   backlogSampleInterval: %s   queueTimeout: %s
#   sustained (how long errors or failing readiness must last): %s
# The rules join every series to goharvest_reaper_info (which each reaper serves) on job,
# instance and harvest, to judge the reapers of one outbox (their leaderGroupID, label group)
# together.
`, promDuration(l.HeartbeatTimeout), promDuration(l.HeldCheckInterval), promDuration(l.BacklogSampleInterval),
		promDuration(l.QueueTimeout), promDuration(sustained))
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(AlertRules(h, sustained)); err != nil {
		panic(err) // plain structs of strings always encode
	}
	enc.Close()
	return b.Bytes()
}

// promDuration writes d as Prometheus reads durations: 20s, 2m, 1m30s, 250ms.
func promDuration(d time.Duration) string {
	if d%time.Second != 0 {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	var s string
	if h := d / time.Hour; h > 0 {
		s += fmt.Sprintf("%dh", h)
	}
	if m := d % time.Hour / time.Minute; m > 0 {
		s += fmt.Sprintf("%dm", m)
	}
	if sec := d % time.Minute / time.Second; sec > 0 || s == "" {
		s += fmt.Sprintf("%ds", sec)
	}
	return s
}
