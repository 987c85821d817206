package kubelet

import (
	"context"
	"crypto/x509"
	"time"

	"k8s.io/client-go/kubernetes"
)

// rotateAt is when a certificate is renewed: after 80 % of its lifetime,
// which leaves a fifth of it for the renewal to succeed.
func rotateAt(leaf *x509.Certificate) time.Time {
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 5 * 4)
}

// rotate renews the client certificate whenever it passes rotateAt, with
// client, which authenticates as the node, until ctx ends. When the
// certificate has expired nonetheless, the API server refuses it, and the
// renewal falls back to the bootstrap token.
func (c *credentials) rotate(ctx context.Context, client kubernetes.Interface) {
	b := newBackoff(time.Second, 5*time.Minute)
	for {
		leaf := c.cert.Load().Leaf
		if wait := rotateAt(leaf).Sub(c.now()); wait > 0 {
			if !sleep(ctx, min(wait, c.check)) {
				return
			}
			continue
		}
		var err error
		if c.now().Before(leaf.NotAfter) {
			err = c.renew(ctx, client, "node")
		} else {
			var boot kubernetes.Interface
			if boot, err = c.bootstrapClient(); err == nil {
				err = c.renew(ctx, boot, "bootstrap token, the certificate has expired")
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			b.Reset()
			continue
		}
		d := b.Next()
		c.log.Warn("cannot renew the client certificate; retrying", "err", err, "expires", leaf.NotAfter, "in", d.Round(time.Millisecond))
		if !sleep(ctx, d) {
			return
		}
	}
}
