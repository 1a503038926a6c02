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

// quotedExamples are functions of the example programs, which their tests run against a real
// Postgres, MariaDB and Apache Kafka (examples/embed/main_test.go, examples/stasher/main_test.go,
// examples/mysqlstasher/main_test.go), and the pages that show them: a reader who copies one
// copies code that works. Where two examples share a function's name, its declaration is given up
// to the parameter that tells them apart.
var quotedExamples = []struct {
	file, decl string
	pages      []string
}{
	{filepath.Join("examples", "embed", "main.go"), "func publishOutbox(", []string{"README.md", "docs/getting-started.md"}},
	{filepath.Join("examples", "stasher", "main.go"), "func placeOrder(ctx context.Context, db *sql.DB, st *stasher.Stasher,", []string{"docs/getting-started.md"}},
	{filepath.Join("examples", "mysqlstasher", "main.go"), "func placeOrder(ctx context.Context, db *sql.DB, st *mysqlstasher.Stasher,", []string{"docs/mysql.md"}},
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

// designNotes is the one page of docs/ that may name commits and issues: dated notes on how the
// code came to be, linked from docs/development.md and from no page on a user's path.
const designNotes = "docs/design-notes.md"

var (
	// A commit as a page would name it: a run of 7 to 40 hex digits that stands alone, with at
	// least one digit and one letter among them, so that neither a plain number nor a word of hex
	// letters ("facade", "added") reads as one.
	hexRun    = regexp.MustCompile(`(?i)[0-9a-f]{7,40}`)
	hasDigit  = regexp.MustCompile(`[0-9]`)
	hasLetter = regexp.MustCompile(`(?i)[a-f]`)
	// An issue as a page would name it: "issue 38", "issues 34 and 38", "issue #38", "#38".
	issueRef = regexp.MustCompile(`(?i)\bissues?\s+#?[0-9]+|(^|[\s(\[,;])#[0-9]+\b`)
)

// A hex run stands alone unless a letter, a digit or _ touches it, or, before it, the ., - or / of
// a file name or a version ("v1.2.3abcdef", "0x7fffffff").
const (
	wordChars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
	notBefore = wordChars + ".-/"
	notAfter  = wordChars
)

// commitsAndIssues returns what text names that reads as a commit hash or an issue number.
func commitsAndIssues(text string) []string {
	var found []string
	for _, m := range hexRun.FindAllStringIndex(text, -1) {
		word := text[m[0]:m[1]]
		alone := (m[0] == 0 || !strings.ContainsRune(notBefore, rune(text[m[0]-1]))) &&
			(m[1] == len(text) || !strings.ContainsRune(notAfter, rune(text[m[1]])))
		if alone && hasDigit.MatchString(word) && hasLetter.MatchString(word) {
			found = append(found, "commit "+word)
		}
	}
	for _, m := range issueRef.FindAllString(text, -1) {
		found = append(found, strings.TrimSpace(m))
	}
	return found
}

// The pages a user reads say what holds today: no page names a commit or an issue, which a user
// cannot act on and which go stale. History belongs in git, and design notes in docs/design-notes.md.
func TestDocsNameNoCommitOrIssue(t *testing.T) {
	for _, page := range docPages(t) {
		if filepath.ToSlash(page) == designNotes {
			continue
		}
		for i, line := range strings.Split(readPage(t, page), "\n") {
			for _, f := range commitsAndIssues(line) {
				t.Errorf("%s:%d names %s; say what holds today instead (notes with history go in %s)", page, i+1, f, designNotes)
			}
		}
	}
}

// The check finds what it is for and passes over what merely looks like it.
func TestCommitsAndIssuesFinds(t *testing.T) {
	for text, want := range map[string]int{
		"two at once: 0ecd59f c4c33b6":                                                2,
		"measured on 0ecd59f, before c4c33b6":                                         2,
		"(issue 38) and issues 34":                                                    2,
		"see #38, or issue #12":                                                       2,
		"a 40-digit c4696cb0586f5b4b3f4263de054ae50b3d9566fb":                         1,
		"a 41-digit c4696cb0586f5b4b3f4263de054ae50b3d9566fb0, a path/to/abc1234":     0,
		"a facade added to a decade":                                                  0,
		"1000000 records, 0x7fffffff, 255":                                            0,
		"[Kafka](operations.md#kafka), ## Heading, KIP-890, sha256, v0.4.0, 10.1.2.3": 0,
		"`goharvest.<leaderGroupID>.0`, 2026-11-28, md5(kafka_key)":                   0,
	} {
		if got := commitsAndIssues(text); len(got) != want {
			t.Errorf("commitsAndIssues(%q) = %q, want %d", text, got, want)
		}
	}
}
