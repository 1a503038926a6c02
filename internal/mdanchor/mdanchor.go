// Package mdanchor gives the #fragments GitHub renders for a Markdown page's headings, so that
// the tests that check links into the docs (the docs' own links, the alerting rules'
// runbook_url) agree on one rule.
package mdanchor

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	fencedBlock = regexp.MustCompile("(?ms)^```.*?^```[ \t]*$")
	heading     = regexp.MustCompile(`(?m)^#{1,6} (.+?)[ \t]*$`)
)

// Anchors returns each heading of page (outside fenced code blocks) by its fragment.
func Anchors(page string) map[string]string {
	anchors := map[string]string{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(fencedBlock.ReplaceAllString(page, ""), -1) {
		a := Of(m[1])
		// GitHub numbers a repeated heading's fragment: the second is a-1, the third a-2.
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = m[1]
		} else {
			anchors[a] = m[1]
		}
		seen[a]++
	}
	return anchors
}

// Of is the fragment of one heading: lower case, spaces to hyphens, punctuation dropped.
func Of(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
