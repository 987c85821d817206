package node

import (
	"context"
	"crypto/x509"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/internal/backoff"
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
	b := backoff.Backoff{Initial: time.Second, Max: 5 * time.Minute, Jitter: 0.2}
	for {
		c.checks.Add(1)
		leaf := c.cert.Load().Leaf
		if wait := rotateAt(leaf).Sub(c.now()); wait > 0 {
			if backoff.Sleep(ctx, backoff.RealClock, min(wait, c.check)) != nil {
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
		if backoff.Sleep(ctx, backoff.RealClock, d) != nil {
			return
		}
	}
}
