package stage2

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/image"
)

// TestSecureBootEnabled reads the SecureBoot variable as efivarfs shows
// it: attributes, then the value.
func TestSecureBootEnabled(t *testing.T) {
	for _, tt := range []struct {
		name    string
		data    []byte // nil: no variable
		want    bool
		wantErr bool
	}{
		{name: "enforced", data: []byte{6, 0, 0, 0, 1}, want: true},
		{name: "off", data: []byte{6, 0, 0, 0, 0}},
		{name: "no variable"},
		{name: "malformed", data: []byte{1}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.data != nil {
				if err := os.WriteFile(filepath.Join(dir, secureBootVar), tt.data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := secureBootEnabled(dir)
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("secureBootEnabled = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestUpgradeSecureBoot upgrades a node that booted with Secure Boot:
// a UKI not signed, or signed by keys outside the firmware's db, is
// refused before anything is written; one signed by the db key is
// written, and the progress says by whom.
func TestUpgradeSecureBoot(t *testing.T) {
	dir := t.TempDir()
	esp := newESP(t, filepath.Join(dir, "esp"), "cairn-0.1.0.efi")
	b := newTestBoots(t, esp, dir, "0.1.0")
	b.efivars = filepath.Join(dir, "efivars")
	keys, err := image.GenerateSecureBootKeys(filepath.Join(dir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	// The firmware's variables: Secure Boot on, and a db of the keys' db
	// certificate as efitools makes it.
	if err := os.MkdirAll(b.efivars, 0o755); err != nil {
		t.Fatal(err)
	}
	esl := filepath.Join(dir, "db.esl")
	if out, err := exec.Command("cert-to-efi-sig-list", filepath.Join(string(keys), "db.crt"), esl).CombinedOutput(); err != nil {
		t.Fatalf("cert-to-efi-sig-list: %v\n%s", err, out)
	}
	list, err := os.ReadFile(esl)
	if err != nil {
		t.Fatal(err)
	}
	attrs := []byte{0x27, 0, 0, 0}
	for name, data := range map[string][]byte{secureBootVar: {6, 0, 0, 0, 1}, dbVar: append(attrs, list...)} {
		if err := os.WriteFile(filepath.Join(b.efivars, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.check(); err != nil {
		t.Fatal(err)
	}
	if !b.Status().SecureBoot {
		t.Fatalf("Status = %v, want Secure Boot", b.Status())
	}
	c := controlClient(t, &node{boots: b.boots})
	unsigned := filepath.Join(dir, "unsigned.efi")
	writeUKI(t, unsigned, "0.2.0", 1000)
	sign := func(k image.SecureBootKeys) string {
		out := filepath.Join(t.TempDir(), "signed.efi")
		if err := k.SignPE(unsigned, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	others, err := image.GenerateSecureBootKeys(filepath.Join(dir, "others"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tt := range map[string]struct{ path, want string }{
		"unsigned":          {unsigned, "not signed"},
		"signed by another": {sign(others), `signed by "Cairn Secure Boot db", which is not in the firmware's db`},
	} {
		if _, err := upgrade(t, c, tt.path, &machine.UpgradeHeader{}); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Upgrade = %v, want PermissionDenied with %q", name, err, tt.want)
		}
	}
	if got := esp.files(t); !slices.Equal(got, []string{"cairn-0.1.0.efi"}) || esp.writes != 0 {
		t.Fatalf("refused upgrades left EFI/Linux %v, %d writable mounts", got, esp.writes)
	}
	var messages []string
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := c.Upgrade(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.SendUKI(stream, sign(keys), &machine.UpgradeHeader{}, func(p *machine.UpgradeProgress) { messages = append(messages, p.Message) }); err != nil {
		t.Fatal(err)
	}
	if want := `signed by "Cairn Secure Boot db" of the firmware's db`; !slices.ContainsFunc(messages, func(m string) bool { return strings.Contains(m, want) }) {
		t.Errorf("upgrade progress %q, want it to say %q", messages, want)
	}
	if got := esp.files(t); !slices.Equal(got, []string{"cairn-0.1.0.efi", "cairn-0.2.0+3.efi"}) {
		t.Errorf("EFI/Linux after the signed upgrade = %v", got)
	}
}
