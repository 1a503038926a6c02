package goharvest

// Version is this release of goharvest, CHANGELOG.md's newest release heading
// (TestVersionIsChangelogsNewestRelease holds the two equal). The reaper reports it, unless a
// build stamps another at link time.
const Version = "v0.4.0"
