package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteNoCloud reads a NoCloud volume back with mtools and wants its
// label, its two files, a clean filesystem, and the same bytes from a
// second write elsewhere; a config too large for the least size gets a
// larger volume.
func TestWriteNoCloud(t *testing.T) {
	needTools(t, mkfsVfat, mcopy, mtype, fsckVfat)
	mlabel := tool{"mlabel", "mtools"}
	needTools(t, mlabel)
	ctx := context.Background()
	n := NoCloud{UserData: []byte("apiVersion: cairn.dev/v1alpha1\n"), MetaData: []byte("instance-id: node-1\n"), SourceDateEpoch: testEpoch}
	var images []string
	for range 2 {
		out := filepath.Join(t.TempDir(), "cidata.img")
		if err := WriteNoCloud(ctx, n, out); err != nil {
			t.Fatal(err)
		}
		images = append(images, out)
	}
	img := images[0]
	if !sameFiles(t, images[0], images[1]) {
		t.Error("two writes of the same NoCloud volume differ")
	}
	env := []string{"MTOOLS_SKIP_CHECK=1"}
	if label, _, err := mlabel.run(ctx, env, "-i", img, "-s", "::"); err != nil || !strings.Contains(string(label), "CIDATA") {
		t.Errorf("mlabel -s: %q, %v; want the label CIDATA", label, err)
	}
	for name, want := range map[string][]byte{"user-data": n.UserData, "meta-data": n.MetaData} {
		got, _, err := mtype.run(ctx, env, "-i", img, "::/"+name)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	if out, _, err := fsckVfat.run(ctx, nil, "-n", img); err != nil {
		t.Errorf("fsck.vfat -n: %v\n%s", err, out)
	}
	if st, err := os.Stat(img); err != nil || st.Size() != minNoCloudSize {
		t.Errorf("volume: %v, want %d bytes", err, minNoCloudSize)
	}

	large := NoCloud{UserData: randomBytes(3<<20, 5), SourceDateEpoch: testEpoch}
	out := filepath.Join(t.TempDir(), "cidata.img")
	if err := WriteNoCloud(ctx, large, out); err != nil {
		t.Fatalf("a NoCloud volume of 3 MiB of user-data: %v", err)
	}
	if got, _, err := mtype.run(ctx, env, "-i", out, "::/user-data"); err != nil || !bytes.Equal(got, large.UserData) {
		t.Errorf("3 MiB of user-data read back as %d bytes, %v", len(got), err)
	}
}
