package strictyaml

import (
	"strings"
	"testing"
	"time"
)

type inner struct {
	Wait  time.Duration `yaml:"wait"`
	Count int           `yaml:"count"`
}

type outer struct {
	Name  string            `yaml:"name"`
	Inner inner             `yaml:"inner"`
	Props map[string]any    `yaml:"props"`
	Tags  map[string]string `yaml:"tags"`
}

func TestUnmarshalGood(t *testing.T) {
	var got outer
	err := Unmarshal([]byte("name: x\ninner:\n  wait: 150ms\n  count: 3\nprops:\n  a.b: 1\n"), &got)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "x" || got.Inner.Wait != 150*time.Millisecond || got.Inner.Count != 3 || got.Props["a.b"] != 1 {
		t.Fatalf("decoded %+v", got)
	}
}

func TestUnmarshalEmptyDocument(t *testing.T) {
	got := outer{Name: "kept"}
	if err := Unmarshal(nil, &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "kept" {
		t.Fatalf("empty document changed the value: %+v", got)
	}
}

func TestUnmarshalErrorsNameKeyAndLine(t *testing.T) {
	cases := []struct {
		doc  string
		want []string
	}{
		{"name: x\ninner:\n  wiat: 1s\n", []string{`line 3: unknown key "inner.wiat"`}},
		{"inner:\n  wait: soon\n", []string{"line 2: inner.wait:", "soon"}},
		// A bare number would silently mean nanoseconds; it must be written with a unit.
		{"inner:\n  wait: 100\n", []string{"line 2: inner.wait:"}},
		{"inner:\n  count: many\n", []string{"line 2: inner.count:"}},
		{"tags:\n  a: [1, 2]\n", []string{"line 2: tags.a:"}},
		{"name: x\nname2: y\ninner:\n  wiat: 1s\n", []string{`line 2: unknown key "name2"`, `line 4: unknown key "inner.wiat"`}},
	}
	for _, c := range cases {
		var got outer
		err := Unmarshal([]byte(c.doc), &got)
		if err == nil {
			t.Errorf("%q: no error", c.doc)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not contain %q", c.doc, err, w)
			}
		}
	}
}

func TestUnmarshalSyntaxError(t *testing.T) {
	var got outer
	err := Unmarshal([]byte("name: [unclosed\n"), &got)
	if err == nil || !strings.Contains(err.Error(), "line") {
		t.Fatalf("got %v, want a syntax error with a line", err)
	}
}

func TestLines(t *testing.T) {
	lines := Lines([]byte("name: x\ninner:\n  wait: 1s\n\n  count: 2\nprops:\n  a.b: c\n"))
	want := map[string]int{"name": 1, "inner": 2, "inner.wait": 3, "inner.count": 5, "props": 6, "props.a.b": 7}
	for path, line := range want {
		if lines[path] != line {
			t.Errorf("%s on line %d, want %d", path, lines[path], line)
		}
	}
}
