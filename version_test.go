package goharvest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// Version follows CHANGELOG.md, so that a reader of reaper --version finds its changes and upgrade
// notes: when the newest section is a release (## vX.Y.Z), Version is that release; while it is
// "## Unreleased", Version is the development version of a release after the newest one
// (vX.Y.Z-dev), so that a build from main does not claim to be a release it is not.
func TestVersionFollowsChangelog(t *testing.T) {
	changelog, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	top := regexp.MustCompile(`(?m)^## (.*)$`).FindSubmatch(changelog)
	release := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+)\b`).FindSubmatch(changelog)
	if top == nil || release == nil {
		t.Fatal("CHANGELOG.md has no section, or no release heading (## vX.Y.Z)")
	}
	if err := versionFollows(Version, string(top[1]), string(release[1])); err != "" {
		t.Error(err)
	}
}

// versionFollows says what is wrong with version when CHANGELOG.md's newest section is headed
// top and its newest release is newest; "" when nothing is.
func versionFollows(version, top, newest string) string {
	if regexp.MustCompile(`^v\d+\.\d+\.\d+\b`).MatchString(top) {
		if version != newest {
			return "Version is " + version + "; CHANGELOG.md's newest section is the release " + newest + ": cutting a release sets Version to it"
		}
		return ""
	}
	if !regexp.MustCompile(`^Unreleased\b`).MatchString(top) {
		return "CHANGELOG.md's newest section, " + strconv.Quote(top) + ", is neither Unreleased nor a release (vX.Y.Z)"
	}
	next := regexp.MustCompile(`^(v\d+\.\d+\.\d+)-dev$`).FindStringSubmatch(version)
	if next == nil {
		return "Version is " + version + " while CHANGELOG.md's newest section is Unreleased: it should be the next release's development version, vX.Y.Z-dev"
	}
	if !semverLess(newest, next[1]) {
		return "Version is " + version + ", the development of a release not after CHANGELOG.md's newest, " + newest
	}
	return ""
}

// semverLess reports whether release a (vX.Y.Z) comes before release b.
func semverLess(a, b string) bool {
	parse := func(v string) (n [3]int) {
		m := regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)$`).FindStringSubmatch(v)
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+1])
		}
		return n
	}
	x, y := parse(a), parse(b)
	for i := range x {
		if x[i] != y[i] {
			return x[i] < y[i]
		}
	}
	return false
}

// The rule holds where it should and fails where it should: a release heading wants its own
// version, Unreleased wants a later -dev one.
func TestVersionFollowsCatchesDrift(t *testing.T) {
	for _, c := range []struct {
		version, top, newest string
		ok                   bool
	}{
		{"v0.5.0-dev", "Unreleased", "v0.4.0", true},
		{"v0.4.1-dev", "Unreleased", "v0.4.0", true},
		{"v0.4.0", "Unreleased", "v0.4.0", false},     // a build from main claiming the last release
		{"v0.4.0-dev", "Unreleased", "v0.4.0", false}, // the development of a release already cut
		{"v0.3.0-dev", "Unreleased", "v0.4.0", false},
		{"v0.5.0", "v0.5.0 (2026-12-01)", "v0.5.0", true},
		{"v0.5.0-dev", "v0.5.0 (2026-12-01)", "v0.5.0", false}, // a release cut without setting Version
		{"v0.4.0", "v0.5.0 (2026-12-01)", "v0.5.0", false},
		{"v0.5.0-dev", "Notes", "v0.4.0", false},
		{"v0.10.0-dev", "Unreleased", "v0.9.0", true},
	} {
		if got := versionFollows(c.version, c.top, c.newest); (got == "") != c.ok {
			t.Errorf("Version %s, newest section %q, newest release %s: %q, want ok=%v", c.version, c.top, c.newest, got, c.ok)
		}
	}
}

// README says which version it documents, and the reaper image it and the Kubernetes example
// name is tagged with that version, the tag make image gives by default: a reader of either
// builds and runs the version they describe.
func TestReadmeAndKubernetesExampleNameVersion(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	documents := regexp.MustCompile("documents? goharvest `([^`]+)`").FindSubmatch(readme)
	if documents == nil {
		t.Error("README.md does not say which version it documents (documents goharvest `vX.Y.Z`)")
	} else if string(documents[1]) != Version {
		t.Errorf("README.md documents goharvest %s; Version is %s", documents[1], Version)
	}
	manifests, err := filepath.Glob(filepath.Join("examples", "kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tag := regexp.MustCompile(`goharvest/reaper:([\w.+-]*\w)`)
	tags := 0
	for _, file := range append([]string{"README.md", filepath.Join("docs", "operations.md")}, manifests...) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tag.FindAllSubmatch(text, -1) {
			tags++
			if string(m[1]) != Version {
				t.Errorf("%s tags the reaper's image %s; Version is %s", file, m[1], Version)
			}
		}
	}
	if tags == 0 {
		t.Error("neither README.md nor examples/kubernetes names the reaper's image (goharvest/reaper:TAG)")
	}
}
