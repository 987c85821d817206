package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFileArtifact(t *testing.T) {
	path := writeFile(t, t.TempDir(), "f", []byte("hello\n"))
	got, err := FileArtifact("greeting", path, "note")
	if err != nil {
		t.Fatal(err)
	}
	want := Artifact{
		Name:   "greeting",
		SHA256: "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
		Size:   6,
		Note:   "note",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FileArtifact (-want +got):\n%s", diff)
	}
	if _, err := FileArtifact("missing", filepath.Join(t.TempDir(), "missing"), ""); err == nil {
		t.Error("FileArtifact of a missing file succeeded")
	}
}

func TestManifestWrite(t *testing.T) {
	tests := []struct {
		name    string
		m       Manifest
		want    string
		wantErr string
	}{
		{
			name: "sorted",
			m: Manifest{
				Version: "0.1.0",
				Inputs: []Artifact{
					{Name: "uki-stub", SHA256: "bb", Size: 2, Note: "systemd-boot-efi 252.39-1~deb12u2"},
					{Name: "machine-config", SHA256: "aa", Size: 1},
				},
				Outputs: []Artifact{{Name: "disk.raw", SHA256: "cc", Size: 3}},
			},
			want: `{
  "version": "0.1.0",
  "inputs": [
    {
      "name": "machine-config",
      "sha256": "aa",
      "size": 1
    },
    {
      "name": "uki-stub",
      "sha256": "bb",
      "size": 2,
      "note": "systemd-boot-efi 252.39-1~deb12u2"
    }
  ],
  "outputs": [
    {
      "name": "disk.raw",
      "sha256": "cc",
      "size": 3
    }
  ]
}
`,
		},
		{
			name: "empty",
			m:    Manifest{Version: "0.1.0"},
			want: "{\n  \"version\": \"0.1.0\",\n  \"inputs\": [],\n  \"outputs\": []\n}\n",
		},
		{
			name:    "absolute name",
			m:       Manifest{Outputs: []Artifact{{Name: "/tmp/disk.raw"}}},
			wantErr: `manifest artifact "/tmp/disk.raw": name is an absolute path`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "manifest.json")
			err := tt.m.Write(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Write() error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(readFile(t, path))); diff != "" {
				t.Errorf("manifest (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDiskArtifact wants the blocks digest of a disk to be that of its
// bytes, computed here from every byte, the same for a sparse file and for
// one written whole, and another for one byte or one zero more.
func TestDiskArtifact(t *testing.T) {
	dir := t.TempDir()
	const size = 3<<20 + 100 // not a whole number of blocks
	content := make([]byte, size)
	copy(content[1<<20+100:], randomBytes(5000, 1)) // across blocks, not block-aligned
	copy(content[size-10:], "last bytes")
	whole := writeFile(t, dir, "whole", content)
	sparse := filepath.Join(dir, "sparse")
	if err := createSparse(sparse, size); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(sparse, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{1<<20 + 100, size - 10} {
		end := off + 5000
		if off == size-10 {
			end = size
		}
		if _, err := f.WriteAt(content[off:end], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if diskUsage(t, sparse) >= diskUsage(t, whole) {
		t.Fatalf("the sparse file uses %d bytes, the whole one %d: want fewer", diskUsage(t, sparse), diskUsage(t, whole))
	}

	// The digest as defined, from every byte.
	h := sha256.New()
	for off := 0; off < size; off += 4096 {
		blk := content[off:min(off+4096, size)]
		if bytes.Count(blk, []byte{0}) == len(blk) {
			continue
		}
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(off)))
		h.Write(blk)
	}
	h.Write(binary.BigEndian.AppendUint64(nil, size))
	want := hex.EncodeToString(h.Sum(nil))

	ctx := context.Background()
	for _, path := range []string{whole, sparse} {
		a, err := DiskArtifact(ctx, "disk", path)
		if err != nil {
			t.Fatal(err)
		}
		if a.BlocksSHA256 != want || a.Size != size || a.SHA256 != "" {
			t.Errorf("DiskArtifact(%s) = %+v, want blocks digest %s and size %d", filepath.Base(path), a, want, size)
		}
	}
	for name, changed := range map[string][]byte{
		"a byte changed":  append(append([]byte{}, content[:size-1]...), 'X'),
		"one zero longer": append(append([]byte{}, content...), 0),
	} {
		a, err := DiskArtifact(ctx, name, writeFile(t, dir, "changed", changed))
		if err != nil {
			t.Fatal(err)
		}
		if a.BlocksSHA256 == want {
			t.Errorf("DiskArtifact of the disk with %s has the same digest", name)
		}
	}
}
