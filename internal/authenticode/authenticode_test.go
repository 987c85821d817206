package authenticode_test

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/internal/authenticode"
	"github.com/cairn-os/cairn/test/need"
)

// signedUKI writes a UKI from the systemd stub and signs it with sbsign,
// with keys of GenerateSecureBootKeys; it returns the unsigned and the
// signed image and the keys.
func signedUKI(t *testing.T, dir string) (unsigned, signed string, keys image.SecureBootKeys) {
	t.Helper()
	const stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	need.File(t, stub, "systemd-boot-efi")
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unsigned = filepath.Join(dir, "uki.efi")
	if err := image.WriteUKI(unsigned, image.UKI{Stub: stub, OSRelease: []byte("ID=cairn\nIMAGE_VERSION=0.2.0\n"), Cmdline: []byte("quiet"),
		Linux: write("vmlinuz", strings.Repeat("kernel", 5000)), Initrd: write("initrd", strings.Repeat("initrd", 9000))}); err != nil {
		t.Fatal(err)
	}
	keys, err := image.GenerateSecureBootKeys(filepath.Join(dir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	// Signed by sbsigntool, an implementation apart from Sign's.
	signed = filepath.Join(dir, "uki.signed.efi")
	if out, err := exec.Command("sbsign", "--key", filepath.Join(string(keys), "db.key"), "--cert", filepath.Join(string(keys), "db.crt"),
		"--output", signed, unsigned).CombinedOutput(); err != nil {
		t.Fatalf("sbsign: %v\n%s", err, out)
	}
	return unsigned, signed, keys
}

// readCert reads a PEM certificate.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func verifyFile(t *testing.T, path string, db []*x509.Certificate) (*x509.Certificate, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return authenticode.Verify(f, st.Size(), db)
}

// TestVerify checks a UKI signed by sbsign (whose signature EDK2's
// firmware takes: TestSecureBoot in test/e2e) against the db that
// efitools' cert-to-efi-sig-list makes, and refuses an unsigned one, a
// changed one and one signed by other keys.
func TestVerify(t *testing.T) {
	dir := t.TempDir()
	unsigned, signed, keys := signedUKI(t, dir)
	esl := filepath.Join(dir, "db.esl")
	if out, err := exec.Command("cert-to-efi-sig-list", filepath.Join(string(keys), "db.crt"), esl).CombinedOutput(); err != nil {
		t.Fatalf("cert-to-efi-sig-list: %v\n%s", err, out)
	}
	data, err := os.ReadFile(esl)
	if err != nil {
		t.Fatal(err)
	}
	// Two lists, as a db with another vendor's certificate first.
	db, err := authenticode.ParseSignatureDatabase(append(bytes.Clone(data), data...))
	if err != nil || len(db) != 2 || !db[0].Equal(readCert(t, filepath.Join(string(keys), "db.crt"))) {
		t.Fatalf("ParseSignatureDatabase = %d certificates, %v; want db.crt twice", len(db), err)
	}

	signer, err := verifyFile(t, signed, db)
	if err != nil || signer.Subject.CommonName != "Cairn Secure Boot db" {
		t.Errorf("Verify(signed) = %v, %v; want signed by Cairn Secure Boot db", signer, err)
	}
	if _, err := verifyFile(t, unsigned, db); !errors.Is(err, authenticode.ErrNotSigned) {
		t.Errorf("Verify(unsigned) = %v, want ErrNotSigned", err)
	}

	changed := filepath.Join(dir, "changed.efi")
	b, err := os.ReadFile(signed)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("IMAGE_VERSION=0.2.0"))
	b[i+len("IMAGE_VERSION=0.")] = '3'
	if err := os.WriteFile(changed, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := verifyFile(t, changed, db); err == nil || !strings.Contains(err.Error(), "digest differs") {
		t.Errorf("authenticode.Verify(changed) = %v, want the digest to differ", err)
	}

	_, other, _ := signedUKI(t, t.TempDir())
	if _, err := verifyFile(t, other, db); err == nil || !strings.Contains(err.Error(), "not in the firmware's db") {
		t.Errorf("authenticode.Verify(signed by other keys) = %v, want it refused", err)
	}
	if _, err := verifyFile(t, signed, nil); err == nil {
		t.Error("Verify with an empty db: no error")
	}
}

// TestSign signs a UKI and systemd-boot in Go and checks them with
// sbsigntool's sbverify and with Verify; signing twice gives the same
// bytes, and a signed image is not signed again.
func TestSign(t *testing.T) {
	dir := t.TempDir()
	unsigned, _, keys := signedUKI(t, dir)
	cert, key := readCert(t, filepath.Join(string(keys), "db.crt")), readKey(t, filepath.Join(string(keys), "db.key"))
	for _, in := range []string{unsigned, "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"} {
		img, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		signed, err := authenticode.Sign(img, cert, key)
		if err != nil {
			t.Fatalf("authenticode.Sign(%s): %v", in, err)
		}
		again, err := authenticode.Sign(img, cert, key)
		if err != nil || !bytes.Equal(signed, again) {
			t.Errorf("authenticode.Sign(%s) twice: different bytes (%v)", in, err)
		}
		out := filepath.Join(t.TempDir(), "signed.efi")
		if err := os.WriteFile(out, signed, 0o644); err != nil {
			t.Fatal(err)
		}
		if msg, err := exec.Command("sbverify", "--cert", filepath.Join(string(keys), "db.crt"), out).CombinedOutput(); err != nil || !strings.Contains(string(msg), "Signature verification OK") {
			t.Errorf("sbverify %s: %v\n%s", in, err, msg)
		}
		if _, err := authenticode.Verify(bytes.NewReader(signed), int64(len(signed)), []*x509.Certificate{cert}); err != nil {
			t.Errorf("authenticode.Verify(authenticode.Sign(%s)): %v", in, err)
		}
		if _, err := authenticode.Sign(signed, cert, key); err == nil {
			t.Errorf("Sign of the signed %s: no error", in)
		}
	}
}

// readKey reads a PEM PKCS #8 private key.
func readKey(t *testing.T, path string) crypto.Signer {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k.(crypto.Signer)
}
