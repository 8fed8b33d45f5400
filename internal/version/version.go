// Package version holds mqlet's version, set at build time with -ldflags.
package version

// Version is overwritten by `make build` (-X .../internal/version.Version=...).
var Version = "dev"
