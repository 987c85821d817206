package image

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/cairn-os/cairn/internal/authenticode"
)

// SecureBootKeys is a directory of the UEFI Secure Boot keys that an
// image is signed with and that its firmware enrolls: the platform key
// (PK), the key exchange key (KEK) and the signature database key (db),
// each a PEM certificate NAME.crt and key NAME.key.
type SecureBootKeys string

// secureBootKeyNames are the keys, in the order the firmware takes them:
// db and KEK while it is in setup mode, PK last, which ends it.
var secureBootKeyNames = []string{"db", "KEK", "PK"}

// efitools' tools make the signed updates of the firmware's variables.
var (
	certToSigList = tool{"cert-to-efi-sig-list", "efitools"}
	signSigList   = tool{"sign-efi-sig-list", "efitools"}
)

func (k SecureBootKeys) cert(name string) string { return filepath.Join(string(k), name+".crt") }
func (k SecureBootKeys) key(name string) string  { return filepath.Join(string(k), name+".key") }

// Certs returns the paths of the keys' certificates, db's first.
func (k SecureBootKeys) Certs() []string {
	var certs []string
	for _, n := range secureBootKeyNames {
		certs = append(certs, k.cert(n))
	}
	return certs
}

// Check says which file of the keys is missing.
func (k SecureBootKeys) Check() error {
	for _, n := range secureBootKeyNames {
		for _, p := range []string{k.cert(n), k.key(n)} {
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("Secure Boot keys: %w (`cairn config gen --secure-boot` makes them)", err)
			}
		}
	}
	return nil
}

// GenerateSecureBootKeys writes new keys into the directory dir, which
// must not hold keys already: RSA 2048 (what every firmware takes),
// self-signed, valid for 30 years.
func GenerateSecureBootKeys(dir string) (SecureBootKeys, error) {
	k := SecureBootKeys(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	now := time.Now()
	for _, n := range secureBootKeyNames {
		if _, err := os.Stat(k.key(n)); err == nil {
			return "", fmt.Errorf("%s exists: keys are never overwritten", k.key(n))
		}
		priv, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return "", err
		}
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
		if err != nil {
			return "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber:          serial,
			Subject:               pkix.Name{CommonName: "Cairn Secure Boot " + n},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.AddDate(30, 0, 0),
			KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
			BasicConstraintsValid: true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
		if err != nil {
			return "", err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(k.key(n), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
			return "", err
		}
		if err := os.WriteFile(k.cert(n), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return "", err
		}
	}
	return k, nil
}

// SignPE signs the PE image in (systemd-boot, a UKI) with db's key into
// out: an Authenticode signature (authenticode.Sign), the same bytes for
// the same input, where sbsign stamps the time of signing.
func (k SecureBootKeys) SignPE(in, out string) error {
	cert, key, err := k.db()
	if err != nil {
		return err
	}
	img, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	signed, err := authenticode.Sign(img, cert, key)
	if err != nil {
		return fmt.Errorf("signing %s: %w", filepath.Base(in), err)
	}
	return os.WriteFile(out, signed, 0o644)
}

// db returns db's certificate and key.
func (k SecureBootKeys) db() (*x509.Certificate, crypto.Signer, error) {
	read := func(path, typ string) ([]byte, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		block, _ := pem.Decode(data)
		if block == nil || block.Type != typ {
			return nil, fmt.Errorf("%s: no PEM %s", path, typ)
		}
		return block.Bytes, nil
	}
	der, err := read(k.cert("db"), "CERTIFICATE")
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", k.cert("db"), err)
	}
	der, err = read(k.key("db"), "PRIVATE KEY")
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", k.key("db"), err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not a signing key", k.key("db"))
	}
	return cert, signer, nil
}

// WriteEnrollment writes db.auth, KEK.auth and PK.auth into dir: signed
// updates of the firmware's variables of those names, which systemd-boot
// enrolls from loader/keys/auto while the firmware is in setup mode. PK
// and KEK are signed by PK, db by KEK; the updates are stamped with the
// time epoch, owned by a GUID derived from PK's certificate.
func (k SecureBootKeys) WriteEnrollment(ctx context.Context, dir string, epoch int64) (map[string]string, error) {
	pk, err := os.ReadFile(k.cert("PK"))
	if err != nil {
		return nil, err
	}
	owner := uuid.NewHash(sha256.New(), idNamespace, append([]byte("secure boot owner\x00"), pk...), 8)
	stamp := time.Unix(epoch, 0).UTC().Format(time.DateTime)
	signer := map[string]string{"PK": "PK", "KEK": "PK", "db": "KEK"}
	files := map[string]string{}
	for _, n := range secureBootKeyNames {
		esl, auth := filepath.Join(dir, n+".esl"), filepath.Join(dir, n+".auth")
		if _, _, err := certToSigList.run(ctx, nil, "-g", owner.String(), k.cert(n), esl); err != nil {
			return nil, err
		}
		if _, _, err := signSigList.run(ctx, nil, "-t", stamp, "-g", owner.String(),
			"-k", k.key(signer[n]), "-c", k.cert(signer[n]), n, esl, auth); err != nil {
			return nil, err
		}
		files[n+".auth"] = auth
	}
	return files, nil
}
