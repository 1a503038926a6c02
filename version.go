package goharvest

// Version is the version of goharvest this source is. Between releases, while CHANGELOG.md's
// newest section is "## Unreleased", it is the next release's development version, vX.Y.Z-dev
// (the reaper adds the commit it was built from: v0.5.0-dev+0123456789ab); cutting a release
// sets it to that release's heading, vX.Y.Z, and the next change after the release to the
// following development version. TestVersionFollowsChangelog holds it to CHANGELOG.md. The reaper
// reports it, unless a build stamps another at link time.
const Version = "v0.5.0-dev"
