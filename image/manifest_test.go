package image

import (
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
