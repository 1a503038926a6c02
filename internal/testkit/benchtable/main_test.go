package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
BenchmarkDrain-2   	       1	5232186435 ns/op	        93.95 peak-MiB	        17.15 pg-µs/rec	        6.5 pg-harv-µs/rec	     38237 records/s	        13.09 relay-µs/rec	        41.2 broker-µs/rec	        45.5 txn/s
BenchmarkSustained/rate=max-2 	1	1 ns/op	 5 max-backlog	 16615 records/s
PASS
`
	var echo, out bytes.Buffer
	rows, err := read(strings.NewReader(in), &echo)
	if err != nil {
		t.Fatal(err)
	}
	if echo.String() != in {
		t.Errorf("the input was not passed through as it was:\n%s", echo.String())
	}
	write(&out, rows)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and two rows, got:\n%s", out.String())
	}
	drain := strings.Fields(lines[1])
	// No MySQL CPU in a Postgres benchmark's row, and no JIT figure in this one: a dash in each
	// column.
	want := []string{"Drain", "38237", "13.09", "17.15", "6.5", "-", "41.2", "-", "45.5", "-", "-", "-", "93.95"}
	if strings.Join(drain, " ") != strings.Join(want, " ") {
		t.Errorf("drain row %q, want %q", drain, want)
	}
	if !strings.HasPrefix(strings.TrimSpace(lines[2]), "Sustained/rate=max") || !strings.Contains(lines[2], "5 max-backlog") {
		t.Errorf("sustained row %q lacks its name or its other metrics", lines[2])
	}
}
