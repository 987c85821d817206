package authenticode

import (
	"bytes"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
)

// certX509 is EFI_CERT_X509_GUID (a5c059a1-94e4-4aa7-87b5-ab155c2bf072)
// as it is stored: its first three fields little-endian.
var certX509 = []byte{0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72}

// ParseSignatureDatabase returns the X.509 certificates of a UEFI
// signature database (db, KEK) as its variable holds it: a series of
// EFI_SIGNATURE_LISTs. Lists of other signature types (hashes) are
// skipped.
func ParseSignatureDatabase(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for len(data) > 0 {
		// SignatureType (16), SignatureListSize, SignatureHeaderSize,
		// SignatureSize (4 each), the header, then the signatures: each
		// an owner GUID (16) and the data.
		if len(data) < 28 {
			return nil, errors.New("signature list: truncated")
		}
		listSize := binary.LittleEndian.Uint32(data[16:])
		headerSize := binary.LittleEndian.Uint32(data[20:])
		sigSize := binary.LittleEndian.Uint32(data[24:])
		if listSize < 28 || int(listSize) > len(data) || sigSize <= 16 || 28+int64(headerSize) > int64(listSize) {
			return nil, fmt.Errorf("signature list: sizes %d, %d, %d in %d bytes", listSize, headerSize, sigSize, len(data))
		}
		if bytes.Equal(data[:16], certX509) {
			for sigs := data[28+headerSize : listSize]; len(sigs) >= int(sigSize); sigs = sigs[sigSize:] {
				c, err := x509.ParseCertificate(sigs[16:sigSize])
				if err != nil {
					return nil, fmt.Errorf("signature list: %w", err)
				}
				certs = append(certs, c)
			}
		}
		data = data[listSize:]
	}
	return certs, nil
}
