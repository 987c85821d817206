package oci

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cairn-os/cairn/internal/bootentry"
)

// PushUKI pushes the UKI at path to a registry as the OCI artifact ref,
// for `cairn node upgrade --image-ref`: one layer of bootentry.MediaType,
// annotated with the UKI's version and file name. insecure allows a
// registry served over plain HTTP. It returns the manifest's digest.
func PushUKI(ctx context.Context, path, ref string, insecure bool) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	info, err := bootentry.ReadUKI(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: static.NewLayer(data, types.MediaType(bootentry.MediaType)),
		Annotations: map[string]string{
			"org.opencontainers.image.version": info.Version,
			"org.opencontainers.image.title":   filepath.Base(path),
		},
	})
	if err != nil {
		return "", err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", fmt.Errorf("push %s: %w", r, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	return digest.String(), nil
}
