// Package conventions holds the tests that keep the repository's conventions
// from drifting; it has no code of its own.
//
// TestPackageDocs fails naming each package of the main module without a
// doc comment: a library package's begins "Package <name>", a main package's
// begins "Command <program>" (the program's name, which can differ from its
// directory's: ./agent is cairn-agent). Directories of test files only, such
// as test/e2e, are not packages anyone imports and need none.
//
// TestDeps fails when a node binary (init, init-stage1, cairn-agent) links a
// package that testdata/deps/<binary>.txt does not list, or no longer links
// one it lists, so that dependency growth shows in review. The lists are
// `go list -deps` of each binary as `make build` builds it (GOOS=linux
// GOARCH=amd64 CGO_ENABLED=0, no build tags, no test dependencies), the
// standard library left out so that they stay the same across Go releases.
// After a change that means to add or remove a dependency, rewrite them with
//
//	go test ./test/conventions -run TestDeps -update
package conventions
