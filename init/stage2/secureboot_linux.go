package stage2

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/internal/authenticode"
)

// efivarsDir is where efivarfs shows the firmware's variables.
const efivarsDir = "/sys/firmware/efi/efivars"

// secureBootVar is the firmware's SecureBoot variable, of the EFI global
// variable GUID: 1 when it enforces Secure Boot.
const secureBootVar = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

// dbVar is the firmware's signature database: the certificates whose
// signatures Secure Boot lets run.
const dbVar = "db-d719b2cb-3d3a-4596-a3bc-dad00e67656f"

// readSignatureDB returns the certificates of the firmware's db, from its
// variables in dir.
func readSignatureDB(dir string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(filepath.Join(dir, dbVar))
	if err != nil {
		return nil, fmt.Errorf("read the firmware's db: %w", err)
	}
	if len(data) < 4 {
		return nil, errors.New("the firmware's db variable is empty")
	}
	return authenticode.ParseSignatureDatabase(data[4:]) // after its attributes
}

// mountEfivars mounts efivarfs on efivarsDir, read-only unless writable
// (the installer's boot entry), and returns where: "" when the node did
// not boot through UEFI. One mounted already is kept.
func mountEfivars(writable bool) (string, error) {
	if _, err := os.Stat(efivarsDir); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if !writable {
		flags |= unix.MS_RDONLY
	}
	err := unix.Mount("efivarfs", efivarsDir, "efivarfs", flags, "")
	if err != nil && !errors.Is(err, unix.EBUSY) {
		return "", fmt.Errorf("mount efivarfs: %w", err)
	}
	return efivarsDir, nil
}

// secureBootEnabled says whether the firmware enforces Secure Boot, from
// its variables in dir: a firmware without the variable does not.
func secureBootEnabled(dir string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, secureBootVar))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the firmware's SecureBoot variable: %w", err)
	}
	// efivarfs gives the variable's 4 bytes of attributes, then its value.
	if len(data) != 5 {
		return false, fmt.Errorf("the firmware's SecureBoot variable holds %d bytes, want 4 of attributes and 1", len(data))
	}
	return data[4] == 1, nil
}
