package registry

import (
	"context"
	"fmt"
	"github.com/cairn-os/cairn/test/repo"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cairn-os/cairn/image/oci"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// epoch is the time of every file and of the image config, so that the same
// binary always makes the same digest.
var epoch = time.Unix(0, 0).UTC()

// BuildAndPush builds the Go main package pkg as a static linux/amd64
// binary, makes it a single-layer OCI image whose entrypoint is
// /usr/bin/<name>, pushes the image to r (with its credentials, if it
// has any) as repoTag (such as "cairn-test/hello:v1") and returns the
// manifest digest ("sha256:…").
//
// pkg is an import path or a directory relative to the root of the module
// that holds the current directory, such as "./test/images/hello". The
// binary is named as go build names it, after the package's last path
// element. The same source and toolchain give the same digest.
func BuildAndPush(ctx context.Context, r *Registry, pkg, repoTag string) (string, error) {
	img, err := buildImage(ctx, pkg)
	if err != nil {
		return "", err
	}
	return Push(ctx, r, img, repoTag)
}

// Push pushes img to r (with its credentials, if it has any) as repoTag
// and returns the manifest digest.
func Push(ctx context.Context, r *Registry, img v1.Image, repoTag string) (string, error) {
	ref, err := name.ParseReference(r.Addr+"/"+repoTag, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", repoTag, err)
	}
	auth := authn.Anonymous
	if r.Username != "" {
		auth = &authn.Basic{Username: r.Username, Password: r.Password}
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("digest of %s: %w", ref, err)
	}
	return digest.String(), nil
}

// buildImage builds pkg and wraps the binary in an image.
func buildImage(ctx context.Context, pkg string) (v1.Image, error) {
	bin, binName, err := goBuild(ctx, pkg)
	if err != nil {
		return nil, err
	}
	img, err := oci.BinaryImage(bin, "/usr/bin/"+binName, epoch)
	if err != nil {
		return nil, fmt.Errorf("image for %s: %w", pkg, err)
	}
	return img, nil
}

// goBuild builds pkg the way Cairn builds its node binaries (static, no
// paths, no build ID, no VCS stamp) for linux/amd64 and returns the binary
// and the name go build gave it.
func goBuild(ctx context.Context, pkg string) ([]byte, string, error) {
	root, err := repo.Root()
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "cairn-test-image-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)

	// -o into a directory lets go build name the binary.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w -buildid=", "-o", dir+string(filepath.Separator), pkg)
	cmd.Dir = root
	// GOAMD64=v1 runs on any x86-64 CPU QEMU emulates, and keeps the
	// digest independent of the host's settings.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOAMD64=v1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("go build %s in %s: %w\n%s", pkg, root, err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, "", err
	}
	if len(entries) != 1 {
		return nil, "", fmt.Errorf("go build %s made %d files, want one binary: is it a single main package?", pkg, len(entries))
	}
	binName := entries[0].Name()
	bin, err := os.ReadFile(filepath.Join(dir, binName))
	if err != nil {
		return nil, "", err
	}
	return bin, binName, nil
}
