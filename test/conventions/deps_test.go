package conventions

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/test/repo"
)

var update = flag.Bool("update", false, "rewrite testdata/deps/*.txt from go list -deps")

// nodeBinaries are the programs of the main module that every image
// ships, by the names that make build gives them, with its build tags.
// init is the node binary: init, cairn-agent and containerd in one.
var nodeBinaries = []struct{ name, pkg, tags string }{
	{"init", "./init", ""},
	{"init-stage1", "./init/stage1", ""},
	{"containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", "no_grpc"},
}

const updateCommand = "go test ./test/conventions -run TestDeps -update"

func TestDeps(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range nodeBinaries {
		t.Run(b.name, func(t *testing.T) {
			got, err := linked(root, b.pkg, b.tags)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "deps", b.name+".txt")
			if *update {
				if err := os.WriteFile(file, depsFile(b.name, b.pkg, got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v\nwrite the list with: %s", err, updateCommand)
			}
			want := parseDeps(data)
			added, removed := difference(got, want), difference(want, got)
			if len(added) == 0 && len(removed) == 0 {
				return
			}
			var msg strings.Builder
			fmt.Fprintf(&msg, "%s (%s) links other packages than test/conventions/%s lists (+ links, not listed; - listed, no longer links):\n", b.name, b.pkg, filepath.ToSlash(file))
			for _, p := range added {
				fmt.Fprintf(&msg, "\t+ %s\n", p)
			}
			for _, p := range removed {
				fmt.Fprintf(&msg, "\t- %s\n", p)
			}
			fmt.Fprintf(&msg, "if that is what the change means to do, rewrite the lists with: %s", updateCommand)
			t.Error(msg.String())
		})
	}
}

// linked returns the sorted import paths of the packages outside the
// standard library that pkg links when built for a node, as make build
// builds it.
func linked(root, pkg, tags string) ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0", "GOFLAGS=-trimpath -buildvcs=false")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	deps := strings.Fields(string(out))
	slices.Sort(deps)
	return slices.Compact(deps), nil
}

func depsFile(name, pkg string, deps []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# The packages that %s (%s) links, the standard library left out:\n", name, pkg)
	fmt.Fprintf(&b, "# go list -deps with GOOS=linux GOARCH=amd64 CGO_ENABLED=0, as make build builds it.\n")
	fmt.Fprintf(&b, "# Checked by TestDeps; rewrite with: %s\n", updateCommand)
	for _, d := range deps {
		fmt.Fprintln(&b, d)
	}
	return b.Bytes()
}

func parseDeps(data []byte) []string {
	var deps []string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			deps = append(deps, line)
		}
	}
	slices.Sort(deps)
	return deps
}

// difference returns the elements of sorted a that sorted b lacks.
func difference(a, b []string) []string {
	var d []string
	for _, x := range a {
		if _, found := slices.BinarySearch(b, x); !found {
			d = append(d, x)
		}
	}
	return d
}
