package node

import (
	"context"
	"crypto/x509"

	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/agent/node/csr"
)

// rotate renews the client certificate whenever it passes its deadline
// (csr.Deadline), with client, which authenticates as the node, until ctx
// ends. When the certificate has expired nonetheless, the API server
// refuses it, and the renewal falls back to the bootstrap token.
func (c *credentials) rotate(ctx context.Context, client kubernetes.Interface) {
	r := csr.Rotator{
		What:    "client certificate",
		Current: func() *x509.Certificate { return c.cert.Load().Leaf },
		Renew: func(ctx context.Context) error {
			if c.now().Before(c.cert.Load().Leaf.NotAfter) {
				return c.renew(ctx, client, "node")
			}
			boot, err := c.bootstrapClient()
			if err != nil {
				return err
			}
			return c.renew(ctx, boot, "bootstrap token, the certificate has expired")
		},
		Now:     c.now,
		Check:   c.check,
		Checked: func() { c.checks.Add(1) },
		Log:     c.log,
	}
	r.Run(ctx)
}
