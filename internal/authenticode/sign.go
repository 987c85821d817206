package authenticode

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/pe"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

var (
	oidContentType    = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 3}
	oidSpcPeImageData = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 2, 1, 15}
	oidRSA            = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	// spcPeImageData is what every signer puts there now: no flags, and
	// the file link "<<<Obsolete>>>".
	spcPeImageData = []byte{0x30, 0x25, 0x03, 0x01, 0x00, 0xa0, 0x20, 0xa2, 0x1e, 0x80, 0x1c,
		0x00, 0x3c, 0x00, 0x3c, 0x00, 0x3c, 0x00, 0x4f, 0x00, 0x62, 0x00, 0x73, 0x00, 0x6f,
		0x00, 0x6c, 0x00, 0x65, 0x00, 0x74, 0x00, 0x65, 0x00, 0x3e, 0x00, 0x3e, 0x00, 0x3e}
	sha256Algorithm = pkix.AlgorithmIdentifier{Algorithm: oidSHA256, Parameters: asn1.NullRawValue}
)

// Sign returns the PE image img signed with key, whose certificate is
// cert: an Authenticode signature (SHA-256, RSA) appended as its
// certificate table, the PE checksum set. It signs only what it needs,
// with no signing time, so the same image and key always give the same
// bytes.
func Sign(img []byte, cert *x509.Certificate, key crypto.Signer) ([]byte, error) {
	// The certificate table starts 8-byte aligned, after the image.
	signed := append(slices.Clone(img), make([]byte, (8-len(img)%8)%8)...)
	digest, sig, err := imageDigest(bytes.NewReader(signed), int64(len(signed)))
	if err != nil {
		return nil, err
	}
	if sig != nil {
		return nil, errors.New("the image is signed already")
	}
	spc, err := asn1.Marshal(struct {
		Data struct {
			Type  asn1.ObjectIdentifier
			Value asn1.RawValue
		}
		Digest struct {
			Algorithm pkix.AlgorithmIdentifier
			Digest    []byte
		}
	}{
		Data: struct {
			Type  asn1.ObjectIdentifier
			Value asn1.RawValue
		}{oidSpcPeImageData, asn1.RawValue{FullBytes: spcPeImageData}},
		Digest: struct {
			Algorithm pkix.AlgorithmIdentifier
			Digest    []byte
		}{sha256Algorithm, digest},
	})
	if err != nil {
		return nil, err
	}
	var content asn1.RawValue
	if _, err := asn1.Unmarshal(spc, &content); err != nil {
		return nil, err
	}
	contentDigest := sha256.Sum256(content.Bytes)

	// The signed attributes, a SET OF in DER order.
	var attrs [][]byte
	for _, a := range []struct {
		typ asn1.ObjectIdentifier
		val any
	}{{oidContentType, oidSpcIndirectData}, {oidMessageDigest, contentDigest[:]}} {
		v, err := asn1.Marshal(a.val)
		if err != nil {
			return nil, err
		}
		enc, err := asn1.Marshal(attribute{Type: a.typ, Values: asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSet, IsCompound: true, Bytes: v}})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, enc)
	}
	slices.SortFunc(attrs, bytes.Compare)
	attrSet, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSet, IsCompound: true, Bytes: bytes.Join(attrs, nil)})
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(attrSet)
	signature, err := key.Sign(rand.Reader, h[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	implicitAttrs := slices.Clone(attrSet)
	implicitAttrs[0] = 0xa0 // [0] IMPLICIT

	si := signerInfo{Version: 1, DigestAlgorithm: sha256Algorithm, SignedAttrs: asn1.RawValue{FullBytes: implicitAttrs},
		SignatureAlgorithm: pkix.AlgorithmIdentifier{Algorithm: oidRSA, Parameters: asn1.NullRawValue}, Signature: signature}
	si.SID.Issuer = asn1.RawValue{FullBytes: cert.RawIssuer}
	si.SID.Serial = cert.SerialNumber
	algos, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSet, IsCompound: true, Bytes: mustMarshal(sha256Algorithm)})
	if err != nil {
		return nil, err
	}
	sd := signedData{Version: 1, DigestAlgorithms: asn1.RawValue{FullBytes: algos},
		Certificates: asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: cert.Raw},
		SignerInfos:  []signerInfo{si}}
	sd.EncapContentInfo.Type = oidSpcIndirectData
	sd.EncapContentInfo.Content = explicit0(spc)
	sdDER, err := asn1.Marshal(sd)
	if err != nil {
		return nil, err
	}
	der, err := asn1.Marshal(contentInfo{ContentType: oidSignedData, Content: explicit0(sdDER)})
	if err != nil {
		return nil, err
	}

	// WIN_CERTIFICATE: length, revision 2.0, PKCS signed data; padded.
	entry := binary.LittleEndian.AppendUint32(nil, uint32(8+len(der)))
	entry = binary.LittleEndian.AppendUint16(entry, 0x0200)
	entry = binary.LittleEndian.AppendUint16(entry, 0x0002)
	entry = append(entry, der...)
	entry = append(entry, make([]byte, (8-len(entry)%8)%8)...)
	at := len(signed)
	signed = append(signed, entry...)
	if err := setSecurityDir(signed, uint32(at), uint32(len(entry))); err != nil {
		return nil, err
	}
	return signed, nil
}

// explicit0 wraps der in a [0] EXPLICIT tag.
func explicit0(der []byte) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: der}
}

func mustMarshal(v any) []byte {
	b, err := asn1.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// setSecurityDir points img's security data directory at the
// certificate table at off of size bytes, and sets its PE checksum.
func setSecurityDir(img []byte, off, size uint32) error {
	f, err := pe.NewFile(bytes.NewReader(img))
	if err != nil {
		return err
	}
	opt := int(binary.LittleEndian.Uint32(img[0x3c:])) + 4 + 20
	dirs := opt + 96
	if _, ok := f.OptionalHeader.(*pe.OptionalHeader64); ok {
		dirs = opt + 112
	}
	entry := dirs + 8*pe.IMAGE_DIRECTORY_ENTRY_SECURITY
	if entry+8 > len(img) {
		return errors.New("no room for the security data directory")
	}
	binary.LittleEndian.PutUint32(img[entry:], off)
	binary.LittleEndian.PutUint32(img[entry+4:], size)
	// The checksum: 16-bit words summed with their carries folded in,
	// the checksum field as zero, plus the file's length.
	checksum := opt + 64
	binary.LittleEndian.PutUint32(img[checksum:], 0)
	var sum uint32
	for i := 0; i+1 < len(img); i += 2 {
		sum += uint32(binary.LittleEndian.Uint16(img[i:]))
		sum = (sum & 0xffff) + (sum >> 16)
	}
	if len(img)%2 == 1 {
		sum += uint32(img[len(img)-1])
		sum = (sum & 0xffff) + (sum >> 16)
	}
	binary.LittleEndian.PutUint32(img[checksum:], sum+uint32(len(img)))
	return nil
}
