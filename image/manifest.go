package image

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// Manifest records what an image build used and what it made.
type Manifest struct {
	Version string     `json:"version"` // Cairn version that made the image
	Inputs  []Artifact `json:"inputs"`
	Outputs []Artifact `json:"outputs"`
}

// Artifact is a file that went into or came out of a build.
type Artifact struct {
	Name   string `json:"name"` // not an absolute path, so manifests compare across machines
	SHA256 string `json:"sha256,omitempty"`
	// BlocksSHA256, instead of SHA256 for a sparse disk, is the SHA-256
	// of its blocks of 4 KiB that are not all zero, each preceded by its
	// offset (8 bytes, big-endian), and then of its size (the same): it
	// depends only on the bytes, never on where the file has holes, and
	// is made without reading the holes.
	BlocksSHA256 string `json:"blocksSha256,omitempty"`
	Size         int64  `json:"size"`
	Note         string `json:"note,omitempty"` // e.g. the Debian package version
}

// FileArtifact returns the artifact called name for the file at path.
func FileArtifact(name, path, note string) (Artifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return Artifact{}, fmt.Errorf("artifact %s: %w", name, err)
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return Artifact{}, fmt.Errorf("artifact %s: reading %s: %w", name, path, err)
	}
	return Artifact{Name: name, SHA256: hex.EncodeToString(h.Sum(nil)), Size: size, Note: note}, nil
}

// DiskArtifact returns the artifact called name for the sparse disk image
// at path, with its BlocksSHA256.
func DiskArtifact(ctx context.Context, name, path string) (Artifact, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Artifact{}, fmt.Errorf("artifact %s: %w", name, err)
	}
	h := sha256.New()
	err = nonZeroBlocks(ctx, path, func(off int64, blk []byte) error {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(off)))
		h.Write(blk)
		return nil
	})
	if err != nil {
		return Artifact{}, fmt.Errorf("artifact %s: reading %s: %w", name, path, err)
	}
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(st.Size())))
	return Artifact{Name: name, BlocksSHA256: hex.EncodeToString(h.Sum(nil)), Size: st.Size()}, nil
}

// Write writes m to path as indented JSON, with inputs and outputs sorted by
// name. It refuses artifact names that are absolute paths.
func (m *Manifest) Write(path string) error {
	out := Manifest{Version: m.Version, Inputs: sorted(m.Inputs), Outputs: sorted(m.Outputs)}
	for _, a := range slices.Concat(out.Inputs, out.Outputs) {
		if filepath.IsAbs(a.Name) {
			return fmt.Errorf("manifest artifact %q: name is an absolute path", a.Name)
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding manifest: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing manifest: %w", err)
	}
	return nil
}

// sorted returns a copy of as sorted by name, never nil so that it encodes
// as an empty list.
func sorted(as []Artifact) []Artifact {
	s := append([]Artifact{}, as...)
	slices.SortStableFunc(s, func(a, b Artifact) int { return cmp.Compare(a.Name, b.Name) })
	return s
}
