// Package tlsprobe tells, in tests, how a TLS server treats a client: with
// TLS 1.3 a server that refuses the client's certificate says so only
// after the handshake, in an alert the client reads next. Through gRPC or
// HTTP that alert often surfaces as a broken pipe or a reset; read
// directly, it is the refusal itself ("tls: unknown certificate
// authority", "tls: certificate required").
package tlsprobe

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"time"

	"github.com/cairn-os/cairn/machineconfig"
)

// HandshakeAndRead connects to endpoint over TLS as cc's client would
// (its certificate if it has one, its CA as the roots, the protocols
// alpn), reads once and returns that read's error (or the handshake's).
// A server that accepts the client waits for a request: the read then
// times out.
func HandshakeAndRead(cc *machineconfig.ClientConfig, endpoint string, alpn ...string) error {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return err
	}
	var cfg *tls.Config
	if cc.Cert == "" {
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM([]byte(cc.CA)) {
			return errors.New("client config: CA is not PEM")
		}
		cfg = &tls.Config{RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS13}
	} else if cfg, err = cc.TLSConfig(host); err != nil {
		return err
	}
	cfg.NextProtos = alpn
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", endpoint, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	return err
}
