// Package client connects to the management API of a Cairn node with the
// operator's client config.
package client

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Client is a connection to one node.
type Client struct {
	machine.MachineClient
	conn *grpc.ClientConn
}

// Dial connects to the node at endpoint (host:port) over mutual TLS, with
// opts added to the connection's. The node's certificate must name the
// endpoint's host.
func Dial(cc *machineconfig.ClientConfig, endpoint string, opts ...grpc.DialOption) (*Client, error) {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: want host:port: %w", endpoint, err)
	}
	tlsCfg, err := cc.TLSConfig(host)
	if err != nil {
		return nil, err
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}, opts...)
	conn, err := grpc.NewClient(endpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	return &Client{MachineClient: machine.NewMachineClient(conn), conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// DialFingerprint connects to a node in maintenance mode at endpoint,
// which has no config and so no certificate of the operator's CA: it is
// trusted by its certificate's fingerprint (the hex SHA-256 of its DER
// bytes, printed on the node's console), and the client shows none.
func DialFingerprint(endpoint, fingerprint string) (*Client, error) {
	want, err := hex.DecodeString(strings.ReplaceAll(fingerprint, ":", ""))
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("fingerprint %q: want the 64 hex digits of the node's console", fingerprint)
	}
	tlsCfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The certificate is checked here, by its fingerprint, not by a CA.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("the node showed no certificate")
			}
			if got := sha256.Sum256(raw[0]); !bytes.Equal(got[:], want) {
				return fmt.Errorf("the node's certificate has the fingerprint %x, not %x: not the node of that console", got, want)
			}
			return nil
		},
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	return &Client{MachineClient: machine.NewMachineClient(conn), conn: conn}, nil
}
