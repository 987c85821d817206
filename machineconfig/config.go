// Package machineconfig defines the machine config, the Kubernetes-style
// YAML document that describes a Cairn node, and the client config that
// operators use to reach a node's API. It parses, validates and generates
// both, together with the PKI that secures the API.
package machineconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// APIVersion is the apiVersion of every document in this package.
const APIVersion = "cairn.dev/v1alpha1"

// Kinds of the documents in this package.
const (
	KindMachineConfig = "MachineConfig"
	KindClientConfig  = "ClientConfig"
)

// DefaultAPIPort is the port the node API listens on unless configured.
const DefaultAPIPort = 50000

// DefaultMetricsPort is the port the node's Prometheus metrics are served
// on unless configured.
const DefaultMetricsPort = 50001

// Config is a machine config.
type Config struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Machine    Machine    `json:"machine"`
	Network    Network    `json:"network"`
	Containerd Containerd `json:"containerd,omitempty"`
	Services   []Service  `json:"services,omitempty"`
	Cluster    *Cluster   `json:"cluster,omitempty"`
}

// Machine holds the node's identity and API settings.
type Machine struct {
	// Hostname is the node's RFC 1123 hostname; it is required.
	Hostname string `json:"hostname"`
	API      API    `json:"api"`
	// Resources limit containerd and the agent; none by default.
	Resources MachineResources `json:"resources,omitzero"`
	// StaticPods are Pods the node runs by itself, from its boot and
	// whether or not an API server answers (see staticpods.go): each a
	// full v1 Pod manifest, kept as written.
	StaticPods []StaticPod `json:"staticPods,omitempty"`

	// Sysctls are kernel parameters that init sets at boot, before the
	// network: by name as sysctl(8) spells it (net.ipv4.tcp_keepalive_time,
	// or with '/' for a name whose parts hold a '.':
	// net/ipv4/conf/eth0.100/rp_filter), each to the value written to its
	// file under /proc/sys. Those Cairn sets itself are refused.
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Files are files that init writes at boot under /etc or /var, before
	// the services start.
	Files []File `json:"files,omitempty"`

	// Time sets how the node keeps its clock: NTP servers.
	Time Time `json:"time,omitzero"`
	// Kernel adds kernel arguments and modules to the image that
	// `cairn image build` makes.
	Kernel Kernel `json:"kernel,omitzero"`
	// Install says where the installer of the image's ISO writes the
	// node's disk.
	Install Install `json:"install,omitzero"`
	// Shutdown sets how long the pods get to end when the node shuts
	// down.
	Shutdown Shutdown `json:"shutdown,omitzero"`
	// Eviction sets the thresholds below which the node evicts pods.
	Eviction Eviction `json:"eviction,omitzero"`
}

// API configures the node API server. Clients authenticate with
// certificates that chain to CA.
type API struct {
	// Port is the TCP port; 0 means DefaultAPIPort.
	Port int `json:"port,omitempty"`
	// MetricsPort is the TCP port of the Prometheus metrics (/metrics,
	// HTTPS with the same certificates: any client certificate of CA may
	// read them); 0 means DefaultMetricsPort.
	MetricsPort int `json:"metricsPort,omitempty"`
	// CA is the PEM CA certificate that client certificates must chain to.
	CA string `json:"ca"`
	// Cert is the PEM server certificate, signed by CA.
	Cert string `json:"cert"`
	// Key is the PEM private key of Cert.
	Key string `json:"key"`
}

// TLSConfig returns the API server's TLS 1.3 config: it presents Cert and
// requires client certificates that chain to CA.
func (a *API) TLSConfig() (*tls.Config, error) {
	cert, err := tls.X509KeyPair([]byte(a.Cert), []byte(a.Key))
	if err != nil {
		return nil, fmt.Errorf("machine.api certificate: %w", err)
	}
	clientCAs := x509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM([]byte(a.CA)) {
		return nil, errors.New("machine.api.ca: not a PEM certificate")
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    clientCAs,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// Load reads and parses the machine config at path; see Parse.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read machine config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a machine config, rejecting unknown fields, applies defaults
// and validates it. If the document decodes but is invalid, Parse returns
// the config together with a *ValidationError.
func Parse(data []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("decode machine config (check field names and types): %w", err)
	}
	c.SetDefaults()
	return &c, c.Validate()
}

// SetDefaults fills in the API port and, if no interface is configured, a
// DHCP interface on the first link that is not loopback.
func (c *Config) SetDefaults() {
	if c.Machine.API.Port == 0 {
		c.Machine.API.Port = DefaultAPIPort
	}
	if c.Machine.API.MetricsPort == 0 {
		c.Machine.API.MetricsPort = DefaultMetricsPort
	}
	if len(c.Network.Interfaces) == 0 {
		c.Network.Interfaces = []Interface{{DHCP: true}}
	}
	for i := range c.Services {
		c.Services[i].setDefaults()
	}
	c.Cluster.setDefaults()

	for i := range c.Machine.Files {
		c.Machine.Files[i].setDefaults()
	}
}

// Marshal encodes c as YAML with keys in sorted order.
func (c *Config) Marshal() ([]byte, error) {
	data, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode machine config: %w", err)
	}
	return data, nil
}
