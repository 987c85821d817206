package registry

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/repo"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const helloPkg = "./test/images/hello"

func pull(t *testing.T, r *Registry, repoTag string) v1.Image {
	t.Helper()
	ref, err := name.ParseReference(r.Addr+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	return img
}

func TestStartListensOnLoopback(t *testing.T) {
	r := Start(t)
	if got := r.Addr; !regexp.MustCompile(`^127\.0\.0\.1:[0-9]+$`).MatchString(got) {
		t.Errorf("Addr = %q, want 127.0.0.1:<port>", got)
	}
	if r.Port() <= 0 {
		t.Errorf("Port() = %d, want the port of %s", r.Port(), r.Addr)
	}
}

func TestBuildAndPushHello(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	r := Start(t)
	digest, err := BuildAndPush(ctx, r, helloPkg, "cairn-test/hello:v1")
	if err != nil {
		t.Fatalf("BuildAndPush(%q) = %v", helloPkg, err)
	}

	img := pull(t, r, "cairn-test/hello:v1")
	if got, err := img.Digest(); err != nil || got.String() != digest {
		t.Errorf("pulled digest = %v, %v; want %s, the digest BuildAndPush returned", got, err, digest)
	}
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type = %q, %v; want %q", mt, err, types.OCIManifestSchema1)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("platform = %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
	}
	if diff := cmp.Diff([]string{"/usr/bin/hello"}, cfg.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1", len(layers))
	}
	if size, err := layers[0].Size(); err == nil {
		m, _ := img.Manifest()
		t.Logf("%s: one %s layer of %d bytes", digest, m.Layers[0].MediaType, size)
	}
	files, bin := readLayer(t, layers[0], "usr/bin/hello")
	want := []tarEntry{
		{"usr/", tar.TypeDir, 0o755},
		{"usr/bin/", tar.TypeDir, 0o755},
		{"usr/bin/hello", tar.TypeReg, 0o755},
	}
	if diff := cmp.Diff(want, files, cmp.AllowUnexported(tarEntry{})); diff != "" {
		t.Errorf("layer files (-want +got):\n%s", diff)
	}

	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		need.Missing(t, "cannot run a linux/amd64 binary on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	path := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, path, "one", "two")
	cmd.Env = append(os.Environ(), "HELLO_ONCE=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run /usr/bin/hello from the layer: %v", err)
	}
	if !regexp.MustCompile(`^hello from cairn-test-image pid=[0-9]+ args=one two\n$`).Match(out) {
		t.Errorf("/usr/bin/hello from the layer printed %q, want one hello line with args=one two", out)
	}
}

func TestBuildAndPushIsReproducible(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	r := Start(t)
	first, err := BuildAndPush(ctx, r, helloPkg, "cairn-test/hello:a")
	if err != nil {
		t.Fatal(err)
	}
	// The same package by its import path, from another directory.
	t.Chdir(filepath.Join(moduleDir(t), "test", "images"))
	second, err := BuildAndPush(ctx, r, "github.com/cairn-os/cairn/test/images/hello", "cairn-test/hello:b")
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("two builds of hello gave digests %s and %s, want the same", first, second)
	}
}

func TestBuildAndPushNotMain(t *testing.T) {
	r := Start(t)
	_, err := BuildAndPush(t.Context(), r, "./test/registry", "cairn-test/lib:v1")
	if err == nil {
		t.Fatal("BuildAndPush of a non-main package succeeded, want an error")
	}
}

type tarEntry struct {
	name string
	typ  byte
	mode int64
}

// readLayer lists the layer's files, checks they are root-owned with a
// fixed time, and returns the content of the file named want.
func readLayer(t *testing.T, l v1.Layer, want string) ([]tarEntry, []byte) {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var entries []tarEntry
	var content []byte
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		entries = append(entries, tarEntry{h.Name, h.Typeflag, h.Mode})
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, want 0:0", h.Name, h.Uid, h.Gid)
		}
		if !h.ModTime.Equal(epoch) {
			t.Errorf("%s has mtime %v, want %v", h.Name, h.ModTime, epoch)
		}
		if h.Name == want {
			if content, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return entries, content
}

// moduleDir returns the root of the module holding this package.
func moduleDir(t *testing.T) string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestBasicAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	r := Start(t, WithBasicAuth("puller", "s3cret"))
	if _, err := BuildAndPush(ctx, r, helloPkg, "cairn-test/private:v1"); err != nil {
		t.Fatalf("BuildAndPush with the registry's credentials: %v", err)
	}
	ref, err := name.ParseReference(r.Addr+"/cairn-test/private:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		auth authn.Authenticator
		ok   bool
	}{
		{"anonymous", authn.Anonymous, false},
		{"wrong password", &authn.Basic{Username: "puller", Password: "guess"}, false},
		{"right password", &authn.Basic{Username: "puller", Password: "s3cret"}, true},
	} {
		_, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuth(tc.auth))
		var terr *transport.Error
		switch {
		case tc.ok && err != nil:
			t.Errorf("pull %s: %v, want it pulled", tc.name, err)
		case !tc.ok && (!errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized):
			t.Errorf("pull %s: %v, want 401 Unauthorized", tc.name, err)
		}
	}
}
