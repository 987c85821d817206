// Package version holds the Cairn version, set at link time with
// -ldflags "-X github.com/cairn-os/cairn/internal/version.Version=...".
package version

// Version of Cairn; "dev" for builds outside the Makefile.
var Version = "dev"
