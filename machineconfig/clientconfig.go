package machineconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"sigs.k8s.io/yaml"
)

// ClientConfig is an operator's config for reaching node APIs.
type ClientConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Endpoints are the nodes' API addresses as host:port.
	Endpoints []string `json:"endpoints"`
	// CA is the PEM CA certificate that server certificates must chain to.
	CA string `json:"ca"`
	// Cert is the PEM client certificate.
	Cert string `json:"cert"`
	// Key is the PEM private key of Cert.
	Key string `json:"key"`
}

// LoadClientConfig reads and parses the client config at path; see
// ParseClientConfig.
func LoadClientConfig(path string) (*ClientConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read client config: %w", err)
	}
	c, err := ParseClientConfig(data)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseClientConfig decodes a client config, rejecting unknown fields, and
// validates it. If the document decodes but is invalid, it returns the
// config together with a *ValidationError.
func ParseClientConfig(data []byte) (*ClientConfig, error) {
	var c ClientConfig
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("decode client config (check field names and types): %w", err)
	}
	return &c, c.Validate()
}

// Validate reports every problem in c as a *ValidationError.
func (c *ClientConfig) Validate() error {
	var v validator
	v.typeMeta(c.APIVersion, c.Kind, KindClientConfig)
	if len(c.Endpoints) == 0 {
		v.add("endpoints", "required")
	}
	for i, e := range c.Endpoints {
		if !validEndpoint(e) {
			v.add(fmt.Sprintf("endpoints[%d]", i), "%q is not host:port, e.g. 10.0.2.15:%d", e, DefaultAPIPort)
		}
	}
	v.cert("ca", c.CA)
	cert := v.cert("cert", c.Cert)
	v.key("key", c.Key, cert, "cert")
	return v.err("client config")
}

// validEndpoint reports whether s is host:port with a port in 1..65535.
func validEndpoint(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

// TLSConfig returns a TLS 1.3 config that presents c's client certificate
// and trusts servers whose certificates chain to c's CA. If serverName is
// empty, crypto/tls and gRPC derive it from the address being dialed.
func (c *ClientConfig) TLSConfig(serverName string) (*tls.Config, error) {
	cert, err := tls.X509KeyPair([]byte(c.Cert), []byte(c.Key))
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(c.CA)) {
		return nil, errors.New("client config ca: not a PEM certificate")
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      roots,
		ServerName:   serverName,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// Marshal encodes c as YAML with keys in sorted order.
func (c *ClientConfig) Marshal() ([]byte, error) {
	data, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode client config: %w", err)
	}
	return data, nil
}

// Write writes c to path, readable only by its owner since it holds a
// private key.
func (c *ClientConfig) Write(path string) error {
	data, err := c.Marshal()
	if err != nil {
		return err
	}
	return writeFile(path, data, 0o600)
}
