package reaper

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
)

// docs/configuration.md's tables are what users read; these tests hold them to the code: every
// field of Config and Limits is listed under its YAML key, each default is what WithDefaults
// gives, and each range is what Validate accepts (checked at both bounds and just outside) and
// what the field's doc comment states.

// configPage is where users read the configuration.
const configPage = "../../../docs/configuration.md"

// configTable returns the cells of the rows of the Markdown table in docs/configuration.md whose header row
// is header, each row's cells trimmed.
func configTable(t *testing.T, header string) [][]string {
	t.Helper()
	f, err := os.Open(configPage)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows [][]string
	in := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case line == header:
			in = true
		case in && strings.HasPrefix(line, "|---"):
		case in && strings.HasPrefix(line, "|"):
			cells := strings.Split(strings.Trim(line, "|"), " | ")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			rows = append(rows, cells)
		case in:
			return rows
		}
	}
	if !in {
		t.Fatalf("%s has no table headed %q", configPage, header)
	}
	return rows
}

var backticked = regexp.MustCompile("`([^`]*)`")

// configFields reads a table's first cell, "`Field` (`yamlKey`)" or "`A`, `B` (Go only)", and
// returns the fields it names, each with its YAML key ("-" for Go only).
func configFields(t *testing.T, cell string) map[string]string {
	t.Helper()
	names, paren, ok := strings.Cut(cell, " (")
	if !ok {
		t.Fatalf("field cell %q: want `Field` (`yamlKey`) or `Field` (Go only)", cell)
	}
	key := "-"
	if paren != "Go only)" {
		m := backticked.FindStringSubmatch(paren)
		if m == nil {
			t.Fatalf("field cell %q: no YAML key", cell)
		}
		key = m[1]
	}
	fields := map[string]string{}
	for _, m := range backticked.FindAllStringSubmatch(names, -1) {
		fields[m[1]] = key
	}
	return fields
}

// structFields returns the fields of a struct type with their YAML keys, an inline struct's
// (Settings' goharvest.Config) among them.
func structFields(typ reflect.Type) map[string]string {
	fields := map[string]string{}
	for f := range typ.Fields() {
		if f.Anonymous && f.Tag.Get("yaml") == ",inline" {
			maps.Copy(fields, structFields(f.Type))
			continue
		}
		fields[f.Name] = f.Tag.Get("yaml")
	}
	return fields
}

func compareFields(t *testing.T, table string, documented, declared map[string]string) {
	t.Helper()
	for name, key := range declared {
		if got, ok := documented[name]; !ok {
			t.Errorf("%s: field %s (%s) is missing from the configuration page", table, name, key)
		} else if got != key {
			t.Errorf("%s: the configuration page gives %s the YAML key %q; its tag says %q", table, name, got, key)
		}
	}
	for name := range documented {
		if _, ok := declared[name]; !ok {
			t.Errorf("%s: the configuration page lists %s, which the struct does not have", table, name)
		}
	}
}

// The configuration page documents Settings: goharvest.Config's fields and the drivers' keys
// the reaper reads.
func TestDocsConfigTableMatchesConfig(t *testing.T) {
	documented := map[string]string{}
	defaults := map[string]string{}
	for _, row := range configTable(t, "| Field (YAML key) | Default | Meaning |") {
		for name, key := range configFields(t, row[0]) {
			documented[name] = key
			defaults[name] = row[1]
		}
	}
	declared := structFields(reflect.TypeFor[Settings]())
	delete(declared, "Limits") // a table of its own
	compareFields(t, "Config", documented, declared)

	// A default written as one literal in backticks is the value itself, or the YAML key of the
	// field whose value it takes.
	c := Settings{Config: goharvest.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}.WithDefaults()
	v := reflect.ValueOf(c)
	keyToField := map[string]string{}
	for name, key := range declared {
		keyToField[key] = name
	}
	for name, def := range defaults {
		f := v.FieldByName(name)
		m := backticked.FindAllStringSubmatch(def, -1)
		if f.Kind() != reflect.String || len(m) != 1 || m[0][0] != def {
			continue // described in words, checked by TestWithDefaults
		}
		want := m[0][1]
		if other, ok := keyToField[want]; ok {
			want = v.FieldByName(other).String()
		}
		if got := f.String(); got != want {
			t.Errorf("Config.%s: the configuration page says the default is %s; WithDefaults gives %q", name, def, got)
		}
	}
}

func TestDocsLimitsTableMatchesLimits(t *testing.T) {
	rows := configTable(t, "| Field (YAML key) | Default | Range | Meaning |")
	documented := map[string]string{}
	for _, row := range rows {
		if len(row) != 4 {
			t.Fatalf("Limits row %q: want 4 cells", row)
		}
		for name, key := range configFields(t, row[0]) {
			documented[name] = key
		}
	}
	declared := structFields(reflect.TypeFor[goharvest.Limits]())
	compareFields(t, "Limits", documented, declared)

	docRanges := limitsDocRanges(t)
	defaults := goharvest.Limits{}.WithDefaults()
	for _, row := range rows {
		for name := range configFields(t, row[0]) {
			key, ok := declared[name]
			if !ok {
				continue
			}
			e := limitsExpr{t: t, l: defaults, field: name}
			t.Run(name, func(t *testing.T) {
				e.t = t
				if want, got := e.eval(strings.TrimSuffix(row[1], " (off)")), e.get(defaults, name); got != want {
					t.Errorf("the configuration page says the default is %s (%s); WithDefaults gives %s", row[1], e.format(want), e.format(got))
				}
				checkRange(t, e, name, key, row[2])
				doc, ok := docRanges[name]
				if !ok {
					t.Fatalf("Limits.%s's doc comment states no range", name)
				}
				// Evaluated on the defaults, the doc comment's bounds must be the page's.
				dlo, dhi, dzero := e.bounds(doc, " to ")
				rlo, rhi, rzero := e.bounds(row[2], "–")
				if dlo != rlo || dhi != rhi || dzero != rzero {
					t.Errorf("the doc comment gives the range %q, the configuration page %q", doc, row[2])
				}
			})
		}
	}
}

// checkRange checks a documented range, "lo–hi", "0, or lo–hi", or with "below X" as its upper bound,
// against Validate: a value at each bound is accepted, one just outside is refused. A bound that
// names another field is a rule between the two, which Validate may report on either.
func checkRange(t *testing.T, e limitsExpr, name, key, cell string) {
	lo, hi, zeroAllowed := e.bounds(cell, "–")
	loExpr, hiExpr, _ := strings.Cut(strings.TrimPrefix(cell, "0, or "), "–")
	below := strings.HasPrefix(hiExpr, "below ")
	unit := int64(1) // just outside a bound: the smallest step of the field's type
	check := func(v int64, accept bool, bound string) {
		l := e.l
		e.set(&l, name, v)
		err := l.Validate()
		refs := append([]string{key}, backticked.FindAllString(bound, -1)...)
		blamed := false
		for _, err := range err {
			for _, ref := range refs {
				blamed = blamed || strings.Contains(err.Error(), "(limits."+strings.Trim(ref, "`")+")")
			}
		}
		mine := slices.ContainsFunc(err, func(err error) bool { return strings.Contains(err.Error(), "(limits."+key+")") })
		switch {
		case accept && mine:
			t.Errorf("%s (documented bound %s) refused: %v", e.format(v), bound, errors.Join(err...))
		case !accept && !blamed:
			t.Errorf("%s, outside the page's range %s, accepted", e.format(v), cell)
		}
	}
	check(lo, true, loExpr)
	check(hi, true, hiExpr)
	if below {
		check(hi+int64(time.Millisecond), false, hiExpr)
	} else {
		check(hi+unit, false, hiExpr)
	}
	if lo-unit != 0 || !zeroAllowed {
		check(lo-unit, false, loExpr)
	}
	if zeroAllowed {
		check(0, true, "0")
	}
}

// bounds evaluates a range, "lo<sep>hi", "0, or lo<sep>hi", or with "below X" as its upper bound:
// the lowest and highest values allowed, and whether 0 is allowed besides.
func (e limitsExpr) bounds(cell, sep string) (lo, hi int64, zeroAllowed bool) {
	e.t.Helper()
	if rest, ok := strings.CutPrefix(cell, "0, or "); ok {
		zeroAllowed, cell = true, rest
	}
	loExpr, hiExpr, ok := strings.Cut(cell, sep)
	if !ok {
		e.t.Fatalf("range %q: want lo%shi", cell, sep)
	}
	lo = e.eval(loExpr)
	hiExpr, below := strings.CutPrefix(hiExpr, "below ")
	hi = e.eval(hiExpr)
	if below {
		hi -= int64(time.Millisecond) // Validate works in librdkafka's milliseconds
	}
	return lo, hi, zeroAllowed
}

// limitsDocRanges returns the range each Limits field's doc comment in internal/engine/epoch/limits.go states
// ("Range: 1ms to 10m."), by field.
func limitsDocRanges(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../engine/epoch/limits.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	rangeRE := regexp.MustCompile(`Range: (.*?)\.(?: |$)`)
	ranges := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.TypeSpec)
		if !ok || spec.Name.Name != "Limits" {
			return true
		}
		for _, field := range spec.Type.(*ast.StructType).Fields.List {
			doc := strings.Join(strings.Fields(field.Doc.Text()), " ")
			if m := rangeRE.FindStringSubmatch(doc); m != nil {
				ranges[field.Names[0].Name] = m[1]
			}
		}
		return false
	})
	return ranges
}

// limitsExpr evaluates the expressions the Limits table uses for defaults and bounds:
// literals ("500ms", "1,000,000"), another field by YAML key ("`heartbeatTimeout`"), halves
// ("`heartbeatTimeout`/2") and min(a, b), over the values of l.
type limitsExpr struct {
	t     *testing.T
	l     goharvest.Limits
	field string // whose type literals take
}

func (e limitsExpr) eval(expr string) int64 {
	e.t.Helper()
	expr = strings.TrimSpace(expr)
	if args, ok := strings.CutPrefix(expr, "min("); ok {
		a, b, ok := strings.Cut(strings.TrimSuffix(args, ")"), ",")
		if !ok {
			e.t.Fatalf("expression %q: min of two", expr)
		}
		return min(e.eval(a), e.eval(b))
	}
	if x, n, ok := strings.Cut(expr, "/"); ok {
		d, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		if err != nil {
			e.t.Fatalf("expression %q: %v", expr, err)
		}
		return e.eval(x) / d
	}
	if m := backticked.FindStringSubmatch(expr); m != nil && m[0] == expr {
		for f := range reflect.TypeFor[goharvest.Limits]().Fields() {
			if f.Tag.Get("yaml") == m[1] {
				return e.get(e.l, f.Name)
			}
		}
		e.t.Fatalf("expression %q: no such field", expr)
	}
	if _, ok := reflect.TypeFor[goharvest.Limits]().FieldByName(expr); ok { // as doc comments name fields
		return e.get(e.l, expr)
	}
	lit := strings.ReplaceAll(expr, ",", "")
	if reflect.ValueOf(e.l).FieldByName(e.field).Type() == reflect.TypeFor[time.Duration]() {
		d, err := time.ParseDuration(lit)
		if err != nil {
			e.t.Fatalf("expression %q: %v", expr, err)
		}
		return int64(d)
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil {
		e.t.Fatalf("expression %q: %v", expr, err)
	}
	return n
}

func (limitsExpr) get(l goharvest.Limits, field string) int64 {
	return reflect.ValueOf(l).FieldByName(field).Int()
}

func (limitsExpr) set(l *goharvest.Limits, field string, v int64) {
	reflect.ValueOf(l).Elem().FieldByName(field).SetInt(v)
}

func (e limitsExpr) format(v int64) string {
	if reflect.ValueOf(e.l).FieldByName(e.field).Type() == reflect.TypeFor[time.Duration]() {
		return time.Duration(v).String()
	}
	return fmt.Sprint(v)
}
