// Package authenticode checks the Authenticode signature of a PE image (a
// UKI, systemd-boot) against the certificates of a UEFI signature
// database, as the firmware does before it starts the image: a node that
// boots with Secure Boot refuses an upgrade its firmware would not boot.
package authenticode

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/pe"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
)

// ErrNotSigned is Verify's error for an image with no signature.
var ErrNotSigned = errors.New("not signed")

var (
	oidSignedData      = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 2}
	oidSpcIndirectData = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 2, 1, 4}
	oidMessageDigest   = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 4}
	oidSHA256          = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}
)

// The PKCS #7 (CMS) structures of an Authenticode signature, as far as
// verifying it needs.
type (
	// Content fields are the [0] EXPLICIT wrappers: their Bytes hold
	// the value.
	contentInfo struct {
		ContentType asn1.ObjectIdentifier
		Content     asn1.RawValue
	}
	signedData struct {
		Version          int
		DigestAlgorithms asn1.RawValue
		EncapContentInfo struct {
			Type    asn1.ObjectIdentifier
			Content asn1.RawValue
		}
		Certificates asn1.RawValue `asn1:"optional,tag:0"`
		CRLs         asn1.RawValue `asn1:"optional,tag:1"`
		SignerInfos  []signerInfo  `asn1:"set"`
	}
	signerInfo struct {
		Version int
		SID     struct {
			Issuer asn1.RawValue
			Serial *big.Int
		}
		DigestAlgorithm    pkix.AlgorithmIdentifier
		SignedAttrs        asn1.RawValue `asn1:"optional,tag:0"`
		SignatureAlgorithm pkix.AlgorithmIdentifier
		Signature          []byte
		UnsignedAttrs      asn1.RawValue `asn1:"optional,tag:1"`
	}
	attribute struct {
		Type   asn1.ObjectIdentifier
		Values asn1.RawValue
	}
	// spcIndirectData is what the signature signs: the image's digest.
	spcIndirectData struct {
		Data   asn1.RawValue
		Digest struct {
			Algorithm pkix.AlgorithmIdentifier
			Digest    []byte
		}
	}
)

// Verify checks that the PE image in r, of size bytes, carries an
// Authenticode signature (SHA-256) of its contents by a certificate of db
// or one issued by a certificate of db, and returns the signer.
func Verify(r io.ReaderAt, size int64, db []*x509.Certificate) (*x509.Certificate, error) {
	digest, sig, err := imageDigest(r, size)
	if err != nil {
		return nil, err
	}
	if sig == nil {
		return nil, ErrNotSigned
	}
	var ci contentInfo
	if _, err := asn1.Unmarshal(sig, &ci); err != nil || !ci.ContentType.Equal(oidSignedData) {
		return nil, fmt.Errorf("the signature is not PKCS #7 signed data: %v", err)
	}
	var sd signedData
	if _, err := asn1.Unmarshal(ci.Content.Bytes, &sd); err != nil {
		return nil, fmt.Errorf("the signature's signed data: %w", err)
	}
	if !sd.EncapContentInfo.Type.Equal(oidSpcIndirectData) {
		return nil, errors.New("the signature does not sign an image digest")
	}
	// The SpcIndirectDataContent; the signer signs its value's digest.
	var content asn1.RawValue
	if _, err := asn1.Unmarshal(sd.EncapContentInfo.Content.Bytes, &content); err != nil {
		return nil, fmt.Errorf("the signed image digest: %w", err)
	}
	var spc spcIndirectData
	if _, err := asn1.Unmarshal(content.FullBytes, &spc); err != nil {
		return nil, fmt.Errorf("the signed image digest: %w", err)
	}
	if !spc.Digest.Algorithm.Algorithm.Equal(oidSHA256) {
		return nil, fmt.Errorf("the image digest is of algorithm %v, not SHA-256", spc.Digest.Algorithm.Algorithm)
	}
	if !bytes.Equal(spc.Digest.Digest, digest) {
		return nil, errors.New("the image is not the one signed: its digest differs")
	}
	certs, err := x509.ParseCertificates(sd.Certificates.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the signature's certificates: %w", err)
	}
	if len(sd.SignerInfos) != 1 {
		return nil, fmt.Errorf("%d signers, want one", len(sd.SignerInfos))
	}
	si := sd.SignerInfos[0]
	i := slices.IndexFunc(certs, func(c *x509.Certificate) bool {
		return c.SerialNumber.Cmp(si.SID.Serial) == 0 && bytes.Equal(c.RawIssuer, si.SID.Issuer.FullBytes)
	})
	if i < 0 {
		return nil, errors.New("the signer's certificate is not in the signature")
	}
	signer := certs[i]
	if err := checkSigner(si, content.Bytes, signer); err != nil {
		return nil, err
	}
	for _, c := range db {
		if signer.Equal(c) || signer.CheckSignatureFrom(c) == nil {
			return signer, nil
		}
	}
	return signer, fmt.Errorf("signed by %q, which is not in the firmware's db nor issued by one of its certificates", signer.Subject.CommonName)
}

// checkSigner checks the signer's signature over its signed attributes,
// and that those hold the digest of content, the SpcIndirectDataContent's
// value.
func checkSigner(si signerInfo, content []byte, signer *x509.Certificate) error {
	if len(si.SignedAttrs.FullBytes) == 0 {
		return errors.New("the signature has no signed attributes")
	}
	want := sha256.Sum256(content)
	found := false
	for rest := si.SignedAttrs.Bytes; len(rest) > 0; {
		var a attribute
		var err error
		if rest, err = asn1.Unmarshal(rest, &a); err != nil {
			return fmt.Errorf("the signed attributes: %w", err)
		}
		if a.Type.Equal(oidMessageDigest) {
			var d []byte
			if _, err := asn1.Unmarshal(a.Values.Bytes, &d); err != nil {
				return fmt.Errorf("the signed message digest: %w", err)
			}
			if !bytes.Equal(d, want[:]) {
				return errors.New("the signed attributes do not hold the image digest's hash")
			}
			found = true
		}
	}
	if !found {
		return errors.New("the signed attributes hold no message digest")
	}
	// They are signed as a SET OF, not with their [0] tag.
	attrs := slices.Clone(si.SignedAttrs.FullBytes)
	attrs[0] = 0x31
	if err := signer.CheckSignature(x509.SHA256WithRSA, attrs, si.Signature); err != nil {
		return fmt.Errorf("the signature does not verify with %q's key: %w", signer.Subject.CommonName, err)
	}
	return nil
}

// imageDigest returns the Authenticode SHA-256 digest of the PE image in
// r, computed as EDK2's firmware does (DxeImageVerificationLib), and the
// first PKCS #7 signature of its certificate table, nil if none.
func imageDigest(r io.ReaderAt, size int64) (digest, sig []byte, err error) {
	f, err := pe.NewFile(io.NewSectionReader(r, 0, size))
	if err != nil {
		return nil, nil, fmt.Errorf("not a PE image: %w", err)
	}
	var lfanew [4]byte
	if _, err := r.ReadAt(lfanew[:], 0x3c); err != nil {
		return nil, nil, err
	}
	opt := int64(binary.LittleEndian.Uint32(lfanew[:])) + 4 + 20 // PE signature, COFF header
	var headers, rvas uint32
	var dirs int64
	var security pe.DataDirectory
	switch h := f.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		headers, rvas, dirs = h.SizeOfHeaders, h.NumberOfRvaAndSizes, opt+112
		if rvas > pe.IMAGE_DIRECTORY_ENTRY_SECURITY {
			security = h.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
		}
	case *pe.OptionalHeader32:
		headers, rvas, dirs = h.SizeOfHeaders, h.NumberOfRvaAndSizes, opt+96
		if rvas > pe.IMAGE_DIRECTORY_ENTRY_SECURITY {
			security = h.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
		}
	default:
		return nil, nil, errors.New("not a PE image: no optional header")
	}
	h := sha256.New()
	hash := func(from, to int64) error {
		if from < 0 || to > size || from > to {
			return fmt.Errorf("a PE region %d-%d outside the image of %d bytes", from, to, size)
		}
		_, err := io.Copy(h, io.NewSectionReader(r, from, to-from))
		return err
	}
	checksum := opt + 64
	secEntry := dirs + 8*pe.IMAGE_DIRECTORY_ENTRY_SECURITY
	regions := [][2]int64{{0, checksum}}
	if rvas <= pe.IMAGE_DIRECTORY_ENTRY_SECURITY {
		regions = append(regions, [2]int64{checksum + 4, int64(headers)})
	} else {
		regions = append(regions, [2]int64{checksum + 4, secEntry}, [2]int64{secEntry + 8, int64(headers)})
	}
	sum := int64(headers)
	sections := slices.Clone(f.Sections)
	slices.SortFunc(sections, func(a, b *pe.Section) int { return int(a.Offset) - int(b.Offset) })
	for _, s := range sections {
		if s.Size == 0 {
			continue
		}
		regions = append(regions, [2]int64{int64(s.Offset), int64(s.Offset) + int64(s.Size)})
		sum += int64(s.Size)
	}
	if size > sum+int64(security.Size) {
		regions = append(regions, [2]int64{sum, size - int64(security.Size)})
	}
	for _, reg := range regions {
		if err := hash(reg[0], reg[1]); err != nil {
			return nil, nil, err
		}
	}
	if security.Size == 0 {
		return h.Sum(nil), nil, nil
	}
	// WIN_CERTIFICATE entries: length, revision, type, then the data,
	// each 8-byte aligned; the security directory's address is a file
	// offset.
	table := make([]byte, security.Size)
	if _, err := r.ReadAt(table, int64(security.VirtualAddress)); err != nil {
		return nil, nil, fmt.Errorf("the certificate table: %w", err)
	}
	for len(table) >= 8 {
		length := binary.LittleEndian.Uint32(table)
		revision, typ := binary.LittleEndian.Uint16(table[4:]), binary.LittleEndian.Uint16(table[6:])
		if length < 8 || int(length) > len(table) {
			return nil, nil, errors.New("the certificate table is malformed")
		}
		if revision == 0x0200 && typ == 0x0002 { // WIN_CERT_TYPE_PKCS_SIGNED_DATA
			return h.Sum(nil), table[8:length], nil
		}
		table = table[min(len(table), int(length+7)&^7):]
	}
	return h.Sum(nil), nil, nil
}
