package oci

import (
	"archive/tar"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var created = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBinaryImageDigest: the same binary and time give the same digest;
// another binary, path or time another.
func TestBinaryImageDigest(t *testing.T) {
	image := func(bin, path string, at time.Time) v1.Image {
		img, err := BinaryImage([]byte(bin), path, at)
		if err != nil {
			t.Fatalf("BinaryImage: %v", err)
		}
		return img
	}
	want := digest(t, image("\x7fELF pause", "/pause", created))
	if got := digest(t, image("\x7fELF pause", "/pause", created)); got != want {
		t.Errorf("the same binary gave the digests %s and %s", want, got)
	}
	for name, img := range map[string]v1.Image{
		"another binary": image("\x7fELF other", "/pause", created),
		"another path":   image("\x7fELF pause", "/usr/bin/pause", created),
		"another time":   image("\x7fELF pause", "/pause", created.Add(time.Second)),
	} {
		if digest(t, img) == want {
			t.Errorf("%s gave the same digest %s", name, want)
		}
	}
}

// TestBinaryImageContents: one layer holding the binary and its parent
// directories, root-owned, mode 0755, stamped with the given time; the
// binary is the entrypoint of a linux/amd64 config.
func TestBinaryImageContents(t *testing.T) {
	img, err := BinaryImage([]byte("\x7fELF agnhost"), "/usr/bin/agnhost", created)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || !cfg.Created.Time.Equal(created) {
		t.Errorf("config is %s/%s created %v, want linux/amd64 created %v", cfg.OS, cfg.Architecture, cfg.Created.Time, created)
	}
	if diff := cmp.Diff([]string{"/usr/bin/agnhost"}, cfg.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	for _, h := range cfg.History {
		if !h.Created.Time.Equal(created) {
			t.Errorf("history entry %q created %v, want %v", h.CreatedBy, h.Created.Time, created)
		}
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type entry struct {
		Name     string
		Type     byte
		Mode     int64
		UID, GID int
		Content  string
	}
	var got []entry
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(created) {
			t.Errorf("%s stamped %v, want %v", h.Name, h.ModTime, created)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, entry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, string(b)})
	}
	want := []entry{
		{Name: "usr/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/agnhost", Type: tar.TypeReg, Mode: 0o755, Content: "\x7fELF agnhost"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer (-want +got):\n%s", diff)
	}
}

// TestWriteArchive: the archive reads back under its tag as the same image:
// the same config (its digest is the image ID, and the config lists the
// layers' digests) and the same layer bytes. (The manifest is not in the
// archive: a reader makes its own.) A name that is no image reference is
// refused, naming it.
func TestWriteArchive(t *testing.T) {
	img, err := BinaryImage([]byte("\x7fELF pause"), "/pause", created)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pause.tar")
	const ref = "registry.k8s.io/pause:3.10"
	if err := WriteArchive(img, ref, out); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("reading %s back as %s: %v", out, ref, err)
	}
	id := func(img v1.Image) v1.Hash {
		h, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if got, want := id(back), id(img); got != want {
		t.Errorf("archive holds the image %s, want %s", got, want)
	}
	// The layers' bytes, hashed here rather than taken from the config.
	layerSums := func(img v1.Image) []v1.Hash {
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		var sums []v1.Hash
		for _, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			h, _, err := v1.SHA256(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			sums = append(sums, h)
		}
		return sums
	}
	if diff := cmp.Diff(layerSums(img), layerSums(back)); diff != "" {
		t.Errorf("archive's layers (-written +read back):\n%s", diff)
	}

	err = WriteArchive(img, "Not A Reference", filepath.Join(t.TempDir(), "bad.tar"))
	if err == nil || !strings.Contains(err.Error(), `image name "Not A Reference"`) {
		t.Errorf("WriteArchive with a bad name = %v, want it named", err)
	}
}
