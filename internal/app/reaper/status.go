package reaper

import (
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// StatusRefresh is how often the status page reloads itself.
const StatusRefresh = 5 * time.Second

// statusPolicy keeps the page from loading anything: no scripts, no fonts, no images but
// inline ones. A pod has no internet, and an operator's browser should not leak the page.
const statusPolicy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

// statusPage is what the page shows, read afresh for every request.
type statusPage struct {
	Outbox                      string // the outbox's name, in a reaper whose file lists outboxes
	Version, Name, Group, State string
	Now                         time.Time
	Uptime                      string
	Ready                       string // "" when ready
	Checked                     bool
	Refresh                     int
	Leads                       int
	Shards                      []shardRow
	InFlight                    int
	Backlog, OldestAge          string // "" unless this reaper leads
	Chart                       chart
	Held                        []heldRow
	HideKeys                    bool
	Errors                      []logEntry
	Config                      [][2]string
}

type shardRow struct {
	Shard             int
	Led               bool
	LeaderID          string
	InFlight, Backlog string
}

type heldRow struct {
	ID       int64
	Topic    string
	Key      string
	Attempts int
	Since    string
	Error    string
}

// chart is the throughput chart, drawn as inline SVG: records published per second over the
// last minutes (chartSpan at most), one point per counter sample.
type chart struct {
	Width, Height int
	Points        string // the polyline's points; "" with fewer than two samples
	Peak          string // the highest rate, the chart's top
	Latest        string
	Span          string
}

// pageHeaders sets the headers of a page: HTML, loading nothing (statusPolicy), never cached.
func pageHeaders(rw http.ResponseWriter) {
	rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	rw.Header().Set("Content-Security-Policy", statusPolicy)
	rw.Header().Set("Cache-Control", "no-store")
}

func (w *watch) serveStatus(rw http.ResponseWriter, r *http.Request) {
	page := w.statusPage()
	pageHeaders(rw)
	if err := statusTemplate.Execute(rw, page); err != nil {
		w.cfg.Logger.Warn("status page", "error", err)
	}
}

func (w *watch) statusPage() statusPage {
	now := time.Now()
	p := statusPage{Outbox: w.outbox, Version: Version(), Name: w.cfg.Name, Group: w.cfg.LeaderGroupID, State: w.h.State().String(),
		Now: now, Uptime: now.Sub(w.started).Round(time.Second).String(), Refresh: int(StatusRefresh.Seconds()),
		InFlight: w.h.InFlightRecords(), HideKeys: w.hideKeys, Errors: w.logs.newest(), Config: w.configSummary()}
	if err, checked := w.readiness(); !checked.IsZero() {
		p.Checked = true
		if err != nil {
			p.Ready = err.Error()
		}
	}
	families, _ := w.registry.Gather()
	inFlight := byLabel(families, "goharvest_shard_in_flight_records", "shard", w.cfg.Name)
	backlog := byLabel(families, "goharvest_shard_outbox_backlog_records", "shard", w.cfg.Name)
	led := w.h.LeadShards()
	p.Leads = len(led)
	for shard := range w.h.ShardCount() {
		row := shardRow{Shard: shard, InFlight: "–", Backlog: "–"}
		if id, ok := led[shard]; ok {
			row.Led, row.LeaderID = true, id.String()
			label := strconv.Itoa(shard)
			if n, ok := inFlight[label]; ok {
				row.InFlight = strconv.FormatFloat(n, 'f', -1, 64)
			}
			if n, ok := backlog[label]; ok {
				row.Backlog = strconv.FormatFloat(n, 'f', -1, 64)
			}
		}
		p.Shards = append(p.Shards, row)
	}
	// Only a leader samples the backlog; a former leader's gauges keep their last value.
	if len(led) > 0 {
		p.Backlog = strconv.FormatFloat(sum(families, "goharvest_outbox_backlog_records", w.cfg.Name), 'f', -1, 64)
		p.OldestAge = (time.Duration(sum(families, "goharvest_outbox_oldest_record_age_seconds", w.cfg.Name) * float64(time.Second))).Round(time.Second).String()
	}
	for _, h := range w.h.HeldRecords() {
		row := heldRow{ID: h.ID, Topic: h.Topic, Key: h.Key, Attempts: h.Attempts,
			Since: now.Sub(h.Since).Round(time.Second).String() + " ago", Error: h.Error}
		if w.hideKeys {
			row.Key = ""
		}
		p.Held = append(p.Held, row)
	}
	p.Chart = throughputChart(w.counterSamples())
	return p
}

// overviewRow is one outbox's line on the page of a reaper whose file lists outboxes.
type overviewRow struct {
	Outbox, Group, Table, State string
	Ready                       string // "" when ready
	Checked                     bool
	Leads, Shards, InFlight     int
	Held                        int
}

// serveOverview serves the page of a reaper with several outboxes: one line for each, naming
// the unwell, with a link to its own page.
func serveOverview(rw http.ResponseWriter, harvesters []*harvester) {
	page := struct {
		Version string
		Now     time.Time
		Refresh int
		Rows    []overviewRow
	}{Version: Version(), Now: time.Now(), Refresh: int(StatusRefresh.Seconds())}
	for _, h := range harvesters {
		row := overviewRow{Outbox: h.outbox.Name, Group: h.w.cfg.LeaderGroupID, Table: h.w.cfg.OutboxTable,
			State: h.h.State().String(), Leads: len(h.h.LeadShards()), Shards: h.h.ShardCount(),
			InFlight: h.h.InFlightRecords(), Held: len(h.h.HeldRecords())}
		if err, checked := h.w.readiness(); !checked.IsZero() {
			row.Checked = true
			if err != nil {
				row.Ready = err.Error()
			}
		}
		page.Rows = append(page.Rows, row)
	}
	pageHeaders(rw)
	overviewTemplate.Execute(rw, page)
}

var overviewTemplate = template.Must(template.Must(pageStyle.Clone()).New("overview").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>reaper · goharvest</title>
{{template "style"}}
</head>
<body>
<h1>reaper: {{len .Rows}} outboxes</h1>
<div class="muted">goharvest {{.Version}} · page read at {{clock .Now}} UTC, reloads every {{.Refresh}}s</div>
<table id="outboxes">
<tr><th>outbox</th><th>group</th><th>table</th><th>state</th><th>readiness</th><th>leads</th><th>in flight</th><th>held</th></tr>
{{range .Rows}}<tr><td class="id"><a href="/?outbox={{.Outbox}}">{{.Outbox}}</a></td><td class="id">{{.Group}}</td><td class="id">{{.Table}}</td><td>{{.State}}</td>
<td>{{if not .Checked}}<span class="muted">not checked yet</span>{{else if .Ready}}<span class="bad">not ready:</span> {{.Ready}}{{else}}<span class="ok">ready</span>{{end}}</td>
<td class="num">{{.Leads}} of {{.Shards}}</td><td class="num">{{.InFlight}}</td><td class="num">{{.Held}}</td></tr>
{{end}}</table>
</body>
</html>
`))

// throughputChart draws published records per second between consecutive samples, across the
// time the samples span (up to chartSpan), so that a reaper started a minute ago fills the chart.
func throughputChart(samples []counterSample) chart {
	c := chart{Width: 600, Height: 120, Span: "minutes", Peak: "0", Latest: "0"}
	if len(samples) < 2 {
		return c
	}
	first, last := samples[0].at, samples[len(samples)-1].at
	span := last.Sub(first)
	if span <= 0 {
		return c
	}
	c.Span = span.Round(time.Second).String()
	rates := make([]float64, 0, len(samples)-1)
	for i := 1; i < len(samples); i++ {
		dt := samples[i].at.Sub(samples[i-1].at).Seconds()
		rate := max(samples[i].published-samples[i-1].published, 0) / dt // a restart resets counters
		rates = append(rates, rate)
	}
	peak := slices.Max(rates)
	top := math.Max(peak, 1) * 1.15 // room for the label
	points := []string{fmt.Sprintf("0,%d", c.Height)}
	for i, rate := range rates {
		x := float64(c.Width) * samples[i+1].at.Sub(first).Seconds() / span.Seconds()
		y := float64(c.Height) * (1 - rate/top)
		points = append(points, fmt.Sprintf("%.1f,%.1f", x, y))
	}
	points = append(points, fmt.Sprintf("%d,%d", c.Width, c.Height))
	c.Points = strings.Join(points, " ")
	c.Peak = fmt.Sprintf("%.0f", peak)
	c.Latest = fmt.Sprintf("%.0f", rates[len(rates)-1])
	return c
}

// shownKafkaProperties are the Kafka properties whose values the page shows; others are listed
// as set, because any of them may hold a secret (a password, a key, an OAuth client secret).
var shownKafkaProperties = map[string]bool{
	"bootstrap.servers": true, "security.protocol": true, "sasl.mechanism": true, "sasl.mechanisms": true,
	"sasl.username": true, "client.id": true, "compression.type": true, "compression.codec": true,
	"linger.ms": true, "queue.buffering.max.ms": true, "batch.size": true, "batch.num.messages": true,
	"message.max.bytes": true, "message.timeout.ms": true, "delivery.timeout.ms": true,
	"transaction.timeout.ms": true, "ssl.ca.location": true, "ssl.endpoint.identification.algorithm": true,
	"enable.ssl.certificate.verification": true,
}

// configSummary lists the settings an operator asks about, never a secret: the data source
// shows only where it points, Kafka properties outside shownKafkaProperties only that they are
// set.
func (w *watch) configSummary() [][2]string {
	c := w.cfg
	l := c.Limits
	rows := [][2]string{
		{"name", c.Name},
		{"leaderGroupID", c.LeaderGroupID},
		{"leaderTopic", c.LeaderTopic},
		{"outboxTable", c.OutboxTable},
		{"shards", strconv.Itoa(c.Shards)},
		{"database", string(c.Database)},
		{"dataSource", c.describeDataSource(c.DataSource)},
	}
	if c.ListenDataSource != "" && c.ListenDataSource != c.DataSource {
		rows = append(rows, [2]string{"listenDataSource", c.describeDataSource(c.ListenDataSource)})
	}
	for _, m := range []struct {
		name  string
		props KafkaConfigMap
	}{{"baseKafkaConfig", c.BaseKafkaConfig}, {"producerKafkaConfig", c.ProducerKafkaConfig}} {
		for _, key := range slices.Sorted(maps.Keys(m.props)) {
			value := "(set, not shown)"
			if shownKafkaProperties[key] {
				value = fmt.Sprint(m.props[key])
			}
			rows = append(rows, [2]string{m.name + "." + key, value})
		}
	}
	deadLetters := "off"
	if l.DeadLetterAttempts > 0 || l.DeadLetterAfter > 0 {
		deadLetters = fmt.Sprintf("after %d attempts or %v (0: no limit)", l.DeadLetterAttempts, l.DeadLetterAfter)
	}
	return append(rows,
		[2]string{"limits.heartbeatTimeout", l.HeartbeatTimeout.String()},
		[2]string{"limits.maxPollInterval", l.MaxPollInterval.String()},
		[2]string{"limits.queueTimeout", l.QueueTimeout.String()},
		[2]string{"limits.maxInFlightRecords", strconv.Itoa(l.MaxInFlightRecords)},
		[2]string{"limits.maxKeyRun", strconv.Itoa(l.MaxKeyRun)},
		[2]string{"limits.sendConcurrency", strconv.Itoa(l.SendConcurrency)},
		[2]string{"limits.heldCheckInterval", l.HeldCheckInterval.String()},
		[2]string{"limits.backlogSampleInterval", l.BacklogSampleInterval.String()},
		[2]string{"dead letters", deadLetters},
		[2]string{"admin.hideKeys", strconv.FormatBool(w.hideKeys)},
	)
}

// pageStyle is what the status page and the overview of several outboxes share: their style,
// and clock, which shows a time of day in UTC.
var pageStyle = template.Must(template.New("style").Funcs(template.FuncMap{
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
}).Parse(`<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d232a; background: #fafbfc; }
table { border-collapse: collapse; background: #fff; } th, td { border: 1px solid #d8dde3; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #eef1f4; } td.num { text-align: right; } .id { font-family: ui-monospace, monospace; }
.ok { color: #17692c; font-weight: 600; } .bad { color: #a4161a; font-weight: 600; } .muted { color: #68727d; }
</style>
`))

var statusTemplate = template.Must(template.Must(pageStyle.Clone()).New("status").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>reaper {{.Name}} · goharvest</title>
{{template "style"}}
</head>
<body>
<h1>reaper <span class="id">{{.Name}}</span></h1>
{{if .Outbox}}<div id="outbox">outbox <b class="id">{{.Outbox}}</b> · <a href="/">all outboxes</a></div>{{end}}
<div class="muted">goharvest {{.Version}} · group <span class="id">{{.Group}}</span> · {{.State}} for {{.Uptime}} · page read at {{clock .Now}} UTC, reloads every {{.Refresh}}s</div>
<p id="readiness">{{if not .Checked}}<span class="muted">readiness not checked yet</span>{{else if .Ready}}<span class="bad">not ready:</span> {{.Ready}}{{else}}<span class="ok">ready</span>: the database and Kafka answer{{end}}</p>

<div class="cards">
<div class="card">leads<b id="leads">{{.Leads}} of {{len .Shards}}</b>shards</div>
<div class="card">in flight<b id="in-flight">{{.InFlight}}</b>records</div>
<div class="card">backlog<b id="backlog">{{if .Backlog}}{{.Backlog}}{{else}}–{{end}}</b>records in the outbox</div>
<div class="card">oldest record<b id="oldest">{{if .OldestAge}}{{.OldestAge}}{{else}}–{{end}}</b>old</div>
<div class="card">held<b id="held-count">{{len .Held}}</b>records</div>
</div>
{{if not .Backlog}}<p class="muted">This reaper leads no shard: the backlog and the oldest record's age are sampled by the leader.</p>{{end}}

<h2>Shards</h2>
<table id="shards">
<tr><th>shard</th><th>published by this reaper</th><th>leader ID</th><th>in flight</th><th>backlog</th></tr>
{{range .Shards}}<tr><td class="num">{{.Shard}}</td><td>{{if .Led}}<span class="ok">yes</span>{{else}}<span class="muted">no (another reaper, or none)</span>{{end}}</td><td class="id">{{.LeaderID}}</td><td class="num">{{.InFlight}}</td><td class="num">{{.Backlog}}</td></tr>
{{end}}</table>

<h2>Published records per second, last {{.Chart.Span}}</h2>
<svg id="throughput" width="{{.Chart.Width}}" height="{{.Chart.Height}}" viewBox="0 0 {{.Chart.Width}} {{.Chart.Height}}" role="img" aria-label="published records per second">
{{if .Chart.Points}}<polygon fill="#1f6feb33" stroke="#1f6feb" stroke-width="1.5" stroke-linejoin="round" points="{{.Chart.Points}}"/>{{else}}<text x="4" y="60" font-size="12" fill="#68727d">collecting samples…</text>{{end}}
<text x="4" y="14" font-size="11" fill="#68727d">peak {{.Chart.Peak}}/s · now {{.Chart.Latest}}/s</text>
</svg>

<h2>Held records</h2>
{{if .Held}}<table id="held">
<tr><th>id</th><th>topic</th>{{if not .HideKeys}}<th>key</th>{{end}}<th>attempts</th><th>failing since</th><th>error</th></tr>
{{range .Held}}<tr><td class="num">{{.ID}}</td><td class="id">{{.Topic}}</td>{{if not $.HideKeys}}<td class="id">{{printf "%q" .Key}}</td>{{end}}<td class="num">{{.Attempts}}</td><td>{{.Since}}</td><td>{{.Error}}</td></tr>
{{end}}</table>
{{if .HideKeys}}<p class="muted">Keys are hidden (admin.hideKeys).</p>{{end}}
{{else}}<p id="held" class="muted">None: every key flows.</p>{{end}}

<h2>Last warnings and errors</h2>
{{if .Errors}}<table id="errors">
<tr><th>time (UTC)</th><th>level</th><th>message</th><th>details</th></tr>
{{range .Errors}}<tr><td>{{clock .Time}}</td><td>{{.Level}}</td><td>{{.Message}}</td><td><code>{{.Attrs}}</code></td></tr>
{{end}}</table>
{{else}}<p id="errors" class="muted">None since the reaper started.</p>{{end}}

<h2>Configuration</h2>
<table id="config">
{{range .Config}}<tr><th>{{index . 0}}</th><td class="id">{{index . 1}}</td></tr>
{{end}}</table>
</body>
</html>
`))
