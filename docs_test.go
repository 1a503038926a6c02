package goharvest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/goharvest/goharvest/internal/mdanchor"
)

// The pages a reader follows from README: what the tests below hold to the code and to each other.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages in docs/: %v", err)
	}
	return append([]string{"README.md", "CHANGELOG.md"}, pages...)
}

// quotedExamples are functions that go test compiles and runs (ExampleHarvest_Run, the stasher's
// Example), and the pages that show them: a reader who copies one copies code that works.
var quotedExamples = []struct {
	file, decl string
	pages      []string
}{
	{"example_test.go", "func publishOutbox(", []string{"README.md", "docs/getting-started.md"}},
	{filepath.Join("stasher", "example_test.go"), "func placeOrder(", []string{"docs/getting-started.md"}},
}

// Every page that shows an example shows it word for word, and the pages listed show it.
func TestDocsQuoteTheExamples(t *testing.T) {
	blocks := map[string][]string{} // page: its Go blocks
	for _, page := range docPages(t) {
		rest := readPage(t, page)
		for {
			_, after, ok := strings.Cut(rest, "```go\n")
			if !ok {
				break
			}
			block, after, ok := strings.Cut(after, "```\n")
			if !ok {
				t.Fatalf("%s: a Go block is not closed", page)
			}
			blocks[page] = append(blocks[page], block)
			rest = after
		}
	}
	for _, q := range quotedExamples {
		source := readPage(t, q.file)
		i := strings.Index(source, "\n"+q.decl)
		if i < 0 {
			t.Fatalf("%s has no %s", q.file, q.decl)
		}
		fn, _, _ := strings.Cut(source[i+1:], "\n}\n")
		want := fn + "\n}\n"
		for _, page := range q.pages {
			found := false
			for _, b := range blocks[page] {
				found = found || b == want
			}
			if !found {
				t.Errorf("%s does not show %s's %s...}", page, q.file, q.decl)
			}
		}
		for page, bs := range blocks {
			for _, b := range bs {
				if strings.HasPrefix(b, q.decl) && b != want {
					t.Errorf("%s's copy of %s differs from %s; copy it over.\n%s:\n%s\n%s:\n%s", page, q.decl, q.file, page, b, q.file, want)
				}
			}
		}
	}
}

var (
	fencedBlock = regexp.MustCompile("(?ms)^```.*?^```[ \t]*$")
	codeSpan    = regexp.MustCompile("`[^`\n]*`")
	linkTarget  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// Every relative link of README, CHANGELOG and docs/ leads to a file that exists, and every
// #anchor to a heading of its page, as GitHub renders them: a moved section breaks the build, not
// the reader's click.
func TestDocsLinksResolve(t *testing.T) {
	for _, page := range docPages(t) {
		text := codeSpan.ReplaceAllString(fencedBlock.ReplaceAllString(readPage(t, page), ""), "")
		for _, m := range linkTarget.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := page
			if path != "" {
				dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %s: %v", page, target, err)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: link %s: an anchor into a file that is not Markdown", page, target)
			} else if _, ok := mdanchor.Anchors(readPage(t, dest))[anchor]; !ok {
				t.Errorf("%s: link %s: %s has no heading with that anchor", page, target, dest)
			}
		}
	}
}

func readPage(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
