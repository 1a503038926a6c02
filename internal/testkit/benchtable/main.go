// Command benchtable reads `go test -bench` output on standard input, passes it through, and
// then prints the benchmarks' figures as one table (make bench uses it). Metrics without a
// column of their own are listed at the end of their row.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// columns are the metrics with a column of their own, in order, with their headings.
var columns = []struct{ unit, heading string }{
	{"records/s", "records/s"},
	{"relay-µs/rec", "relay CPU µs/rec"},
	{"pg-µs/rec", "Postgres CPU µs/rec"},
	{"pg-harv-µs/rec", "harvester's Postgres CPU µs/rec"},
	{"mysql-µs/rec", "MySQL CPU µs/rec"},
	{"broker-µs/rec", "broker CPU µs/rec"},
	{"broker-jit-µs/rec", "of it, JIT µs/rec"},
	{"txn/s", "Kafka txn/s"},
	{"p50-ms", "p50 ms"},
	{"p99-ms", "p99 ms"},
	{"idle-q/s", "idle queries/s"},
	{"peak-MiB", "peak RSS MiB"},
}

type row struct {
	name    string
	metrics map[string]string
	order   []string // units in the order they appeared
}

func main() {
	rows, err := read(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	if len(rows) == 0 {
		fmt.Fprintln(os.Stderr, "benchtable: no benchmark results in the input")
		os.Exit(1)
	}
	fmt.Println()
	write(os.Stdout, rows)
}

// read copies in to echo and collects the benchmark result lines: a name, the iteration count,
// then value-unit pairs.
func read(in io.Reader, echo io.Writer) ([]row, error) {
	var rows []row
	s := bufio.NewScanner(in)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		fmt.Fprintln(echo, line)
		fields := strings.Fields(line)
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") || len(fields)%2 != 0 {
			continue
		}
		r := row{name: strings.TrimPrefix(fields[0], "Benchmark"), metrics: map[string]string{}}
		if i := strings.LastIndexByte(r.name, '-'); i > 0 {
			r.name = r.name[:i] // the GOMAXPROCS suffix
		}
		for i := 2; i+1 < len(fields); i += 2 {
			unit := fields[i+1]
			if unit == "ns/op" {
				continue
			}
			r.metrics[unit] = fields[i]
			r.order = append(r.order, unit)
		}
		rows = append(rows, r)
	}
	return rows, s.Err()
}

func write(out io.Writer, rows []row) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"benchmark"}
	for _, c := range columns {
		header = append(header, c.heading)
	}
	fmt.Fprintln(tw, strings.Join(append(header, "other"), "\t")+"\t")
	for _, r := range rows {
		cells := []string{r.name}
		own := map[string]bool{}
		for _, c := range columns {
			own[c.unit] = true
			v, ok := r.metrics[c.unit]
			if !ok {
				v = "-"
			}
			cells = append(cells, v)
		}
		var other []string
		for _, unit := range r.order {
			if !own[unit] {
				other = append(other, r.metrics[unit]+" "+unit)
			}
		}
		fmt.Fprintln(tw, strings.Join(append(cells, strings.Join(other, ", ")), "\t")+"\t")
	}
	tw.Flush()
}
