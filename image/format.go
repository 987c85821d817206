package image

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// Format is a disk image format that a raw disk can be converted to.
type Format interface {
	// Name is the format's name, as given to FormatByName.
	Name() string
	// Convert writes the raw disk image raw to out in this format. It
	// leaves raw in place.
	Convert(ctx context.Context, raw, out string) error
}

// formats are the known formats, sorted by name.
var formats = []Format{qcow2Format{}, rawFormat{}}

// Formats returns the names of the known formats, sorted.
func Formats() []string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = f.Name()
	}
	return names
}

// FormatByName returns the format called name.
func FormatByName(name string) (Format, error) {
	for _, f := range formats {
		if f.Name() == name {
			return f, nil
		}
	}
	return nil, fmt.Errorf("unknown image format %q: valid formats are %s", name, strings.Join(Formats(), ", "))
}

// rawFormat is the raw disk itself, copied sparsely.
type rawFormat struct{}

func (rawFormat) Name() string { return "raw" }

func (rawFormat) Convert(ctx context.Context, raw, out string) error {
	st, err := os.Stat(raw)
	if err != nil {
		return fmt.Errorf("raw disk: %w", err)
	}
	if err := createSparse(out, st.Size()); err != nil {
		return err
	}
	f, err := os.OpenFile(out, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", out, err)
	}
	defer f.Close()
	if err := copyNonZero(ctx, f, raw, 0); err != nil {
		return fmt.Errorf("copying raw disk: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", out, err)
	}
	return nil
}

// qcow2Format is QEMU's copy-on-write format, made by qemu-img.
type qcow2Format struct{}

func (qcow2Format) Name() string { return "qcow2" }

func (qcow2Format) Convert(ctx context.Context, raw, out string) error {
	_, _, err := qemuImg.run(ctx, nil, "convert", "-f", "raw", "-O", "qcow2", raw, out)
	return err
}
