package api

import (
	"crypto/tls"
	"sync/atomic"

	"github.com/cairn-os/cairn/machineconfig"
)

// Credentials are the API's TLS certificate and client CA, from
// machine.api, replaced whole when a machine config applied live changes
// them: each new connection gets the current ones, open ones keep theirs.
type Credentials struct {
	current atomic.Pointer[tls.Config]
}

// NewCredentials returns the credentials of a.
func NewCredentials(a *machineconfig.API) (*Credentials, error) {
	c := &Credentials{}
	return c, c.Update(a)
}

// Update replaces the credentials with a's; if a's do not load, the
// current ones stay.
func (c *Credentials) Update(a *machineconfig.API) error {
	cfg, err := a.TLSConfig()
	if err != nil {
		return err
	}
	c.current.Store(cfg)
	return nil
}

// ServerConfig is the TLS config of a server with these credentials that
// speaks the application protocols protos (ALPN): each handshake takes
// the credentials current then.
func (c *Credentials) ServerConfig(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: protos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cfg := c.current.Load().Clone()
			cfg.NextProtos = protos
			return cfg, nil
		},
	}
}
