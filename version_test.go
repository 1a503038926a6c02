package goharvest

import (
	"os"
	"regexp"
	"testing"
)

// The version the reaper reports is the newest release CHANGELOG.md describes, so that a reader
// of reaper --version finds its changes and upgrade notes under that heading.
func TestVersionIsChangelogsNewestRelease(t *testing.T) {
	changelog, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+)\b`).FindSubmatch(changelog)
	if m == nil {
		t.Fatal("CHANGELOG.md has no release heading (## vX.Y.Z)")
	}
	if string(m[1]) != Version {
		t.Errorf("Version is %s; CHANGELOG.md's newest release is %s", Version, m[1])
	}
}
