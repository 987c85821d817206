package conventions

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/test/repo"
)

// TestPackageDocs walks the main module's directories (not testdata, not
// those starting with "." or "_", not nested modules) and parses the package
// clause of every Go file that is not a test, whatever its build constraints,
// so that a package built only on another OS or with a tag is checked too.
func TestPackageDocs(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if dir != root {
			if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return filepath.SkipDir // another module (rootfs/components, test/cluster)
			}
		}
		pkgs, err := packageDocs(dir)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, dir)
		for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
			checked++
			if problem := docProblem(pkg, pkgs[pkg]); problem != "" {
				t.Errorf("./%s (package %s) %s", filepath.ToSlash(rel), pkg, problem)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked the doc comments of %d packages under %s, want all of the module's (dozens)", checked, root)
	}
}

// packageDocs returns, for each package name declared by the non-test Go
// files of dir, the text of its doc comment ("" when no file has one).
func packageDocs(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}
	fset := token.NewFileSet()
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return nil, err
		}
		if ignored(f) {
			continue
		}
		pkg := f.Name.Name
		if _, ok := docs[pkg]; !ok {
			docs[pkg] = ""
		}
		if f.Doc != nil && docs[pkg] == "" {
			docs[pkg] = f.Doc.Text()
		}
	}
	return docs, nil
}

// ignored reports whether f is left out of every build (//go:build ignore),
// as a generator run with go run is.
func ignored(f *ast.File) bool {
	for _, g := range f.Comments {
		if g.Pos() >= f.Package {
			break
		}
		if slices.ContainsFunc(g.List, func(c *ast.Comment) bool { return strings.TrimSpace(c.Text) == "//go:build ignore" }) {
			return true
		}
	}
	return false
}

// docProblem says what is wrong with the doc comment of package pkg, or ""
// if nothing is.
func docProblem(pkg, doc string) string {
	want := "Package " + pkg + " "
	if pkg == "main" {
		want = "Command "
	}
	switch {
	case doc == "" && pkg == "main":
		return `has no doc comment: write one above "package main" in one of its files (or a doc.go), beginning "Command <program> ", that says what the program does`
	case doc == "":
		return `has no doc comment: write one above "package ` + pkg + `" in one of its files (or a doc.go), beginning "` + want + `", that says what the package does`
	case !strings.HasPrefix(strings.ReplaceAll(doc, "\n", " "), want):
		first, _, _ := strings.Cut(doc, "\n")
		return `has a doc comment that begins "` + first + `", want it to begin "` + want + `"`
	}
	return ""
}
