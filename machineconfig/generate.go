package machineconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Files written by Bundle.Write, relative to its directory.
const (
	MachineConfigFile = "machine.yaml"
	CACertFile        = "secrets/api-ca.crt"
	CAKeyFile         = "secrets/api-ca.key"
	ClientConfigFile  = "cairnconfig"
)

// GenerateOptions describe the node to generate configs for.
type GenerateOptions struct {
	Hostname string
	// Interface names the link to configure; empty means the first link
	// that is not loopback.
	Interface string
	// Addresses are static addresses in CIDR notation; empty means DHCP.
	Addresses []string
	// Gateway, if set, becomes the default route; it needs Addresses.
	Gateway     string
	Nameservers []string
	// Endpoints are the API addresses (host:port) for the client config;
	// empty means 127.0.0.1:50000.
	Endpoints []string
	// Now starts the certificates' validity; zero means time.Now().
	Now time.Time
	// CA, if set, signs the API certificate and the client config instead
	// of a new CA: the nodes of one cluster share it.
	CA *CA
}

// Bundle is a freshly generated machine config with the CA that signed its
// API certificate and an admin client config for it.
type Bundle struct {
	Config *Config
	CA     *CA
	Client *ClientConfig
}

// Generate creates a new API CA, a machine config whose API certificate it
// signs and an admin client config. Both configs are validated.
func Generate(opts GenerateOptions) (*Bundle, error) {
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	endpoints := opts.Endpoints
	if len(endpoints) == 0 {
		endpoints = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultAPIPort))}
	}
	iface := Interface{Name: opts.Interface, DHCP: len(opts.Addresses) == 0, Addresses: opts.Addresses}
	if opts.Gateway != "" {
		if len(opts.Addresses) == 0 {
			return nil, fmt.Errorf("gateway %s needs a static address: add one, or drop the gateway to use DHCP", opts.Gateway)
		}
		to := "0.0.0.0/0"
		if gw, err := netip.ParseAddr(opts.Gateway); err == nil && !gw.Unmap().Is4() {
			to = "::/0"
		}
		iface.Routes = []Route{{To: to, Via: opts.Gateway}}
	}

	ca := opts.CA
	if ca == nil {
		var err error
		if ca, err = NewCA("cairn api ca", now); err != nil {
			return nil, err
		}
	}
	dnsNames, ips := serverNames(opts.Hostname, opts.Addresses, endpoints)
	serverCert, serverKey, err := ca.IssueServer(opts.Hostname, dnsNames, ips, now)
	if err != nil {
		return nil, err
	}
	clientCert, clientKey, err := ca.IssueClient("admin", RoleAdmin, now)
	if err != nil {
		return nil, err
	}

	cfg := &Config{
		APIVersion: APIVersion,
		Kind:       KindMachineConfig,
		Machine: Machine{
			Hostname: opts.Hostname,
			API: API{
				Port:        DefaultAPIPort,
				MetricsPort: DefaultMetricsPort,
				CA:          string(ca.CertPEM),
				Cert:        string(serverCert),
				Key:         string(serverKey),
			},
		},
		Network: Network{Interfaces: []Interface{iface}, Nameservers: opts.Nameservers},
	}
	client := &ClientConfig{
		APIVersion: APIVersion,
		Kind:       KindClientConfig,
		Endpoints:  endpoints,
		CA:         string(ca.CertPEM),
		Cert:       string(clientCert),
		Key:        string(clientKey),
	}
	if err := errors.Join(cfg.Validate(), client.Validate()); err != nil {
		return nil, fmt.Errorf("check options: %w", err)
	}
	return &Bundle{Config: cfg, CA: ca, Client: client}, nil
}

// serverNames returns the names the API certificate covers: the hostname,
// localhost, the loopback addresses, the static addresses and the hosts of
// the client endpoints. Malformed addresses and endpoints are skipped;
// validation reports them.
func serverNames(hostname string, addresses, endpoints []string) ([]string, []net.IP) {
	dnsNames := []string{hostname, "localhost"}
	addrs := []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}
	addAddr := func(a netip.Addr) {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	for _, s := range addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			addAddr(p.Addr())
		}
	}
	for _, e := range endpoints {
		host, _, err := net.SplitHostPort(e)
		if err != nil || host == "" {
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			addAddr(a)
		} else if !slices.Contains(dnsNames, host) {
			dnsNames = append(dnsNames, host)
		}
	}
	ips := make([]net.IP, len(addrs))
	for i, a := range addrs {
		ips[i] = a.AsSlice()
	}
	return dnsNames, ips
}

// Write writes the bundle's files (see MachineConfigFile and the other
// constants) under dir, creating it if needed. Files holding private keys
// are readable only by their owner. Unless force is set, Write refuses to
// overwrite any of them, so that an existing CA is not lost by accident;
// the error then wraps fs.ErrExist.
func (b *Bundle) Write(dir string, force bool) error {
	cfg, err := b.Config.Marshal()
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{MachineConfigFile, cfg, 0o600}, // holds the server key
		{CACertFile, b.CA.CertPEM, 0o644},
		{CAKeyFile, b.CA.KeyPEM, 0o600},
	}
	if !force {
		for _, name := range []string{MachineConfigFile, CACertFile, CAKeyFile, ClientConfigFile} {
			path := filepath.Join(dir, name)
			_, err := os.Lstat(path)
			if err == nil {
				return fmt.Errorf("%s: %w; refusing to overwrite it", path, fs.ErrExist)
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("check %s: %w", path, err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(CAKeyFile)), 0o700); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return err
		}
	}
	return b.Client.Write(filepath.Join(dir, ClientConfigFile))
}

// writeFile writes data to path with mode perm, also when the file
// already existed with another mode.
func writeFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// Fix the mode before writing secrets into a file that existed.
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
