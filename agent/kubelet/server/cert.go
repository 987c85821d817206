package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	certclient "k8s.io/client-go/kubernetes/typed/certificates/v1"

	"github.com/cairn-os/cairn/agent/node/csr"
)

// selfSignedValidity is how long a self-signed serving certificate is
// valid: it is made anew at each start.
const selfSignedValidity = 365 * 24 * time.Hour

// selfSigned returns a serving certificate for hosts (IP addresses and
// names) signed by its own key, named NODE@UNIXTIME as the kubelet names
// its own.
func selfSigned(nodeName string, hosts []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeName + "@" + strconv.FormatInt(now.Unix(), 10)},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(selfSignedValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	tmpl.DNSNames, tmpl.IPAddresses = sans(append([]string{nodeName}, hosts...))
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// sans splits hosts into the DNS names and IP addresses of a
// certificate, each once, sorted.
func sans(hosts []string) (dns []string, ips []net.IP) {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	slices.Sort(dns)
	slices.SortFunc(ips, func(a, b net.IP) int { return slices.Compare(a.To16(), b.To16()) })
	return slices.Compact(dns), slices.CompactFunc(ips, net.IP.Equal)
}

// addresses are the hosts of a Node: its status.addresses, as the
// kubelet puts them in its serving certificate.
func addresses(n *corev1.Node) []string {
	var hosts []string
	for _, a := range n.Status.Addresses {
		hosts = append(hosts, a.Address)
	}
	return hosts
}

// NodeSource is the Node as the node's informer watches it:
// *node.Member.
type NodeSource interface {
	// Node returns the Node; it is not modified.
	Node() *corev1.Node
	// NodeChanged returns a channel that receives when the Node changed,
	// until stop is called.
	NodeChanged() (changed <-chan struct{}, stop func(), err error)
}

// servingCert is the server's certificate: the one the cluster issued to
// the node (signer kubernetes.io/kubelet-serving) for its addresses, or,
// until there is one, a self-signed one. run requests and renews it.
type servingCert struct {
	nodeName string
	node     NodeSource
	csrs     certclient.CertificateSigningRequestInterface
	file     string
	now      func() time.Time
	check    time.Duration
	log      *slog.Logger

	self   *tls.Certificate
	issued atomic.Pointer[tls.Certificate] // Leaf is set
}

// load makes the stored certificate current if it is the node's and has
// not expired; one for other addresses is renewed by run.
func (s *servingCert) load() {
	cert, err := csr.Load(s.file)
	if err == nil {
		err = csr.Usable(cert.Leaf, s.nodeName, s.now())
	}
	switch {
	case err == nil:
		s.log.Info("using the stored serving certificate", "file", s.file, "expires", cert.Leaf.NotAfter)
		s.issued.Store(cert)
	case !errors.Is(err, fs.ErrNotExist):
		s.log.Warn("stored serving certificate unusable; requesting a new one", "file", s.file, "err", err)
	}
}

// get is the tls.Config's GetCertificate: the issued certificate once
// there is one, which swaps certificates without a new listener.
func (s *servingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.issued.Load(); c != nil {
		return c, nil
	}
	return s.self, nil
}

// run requests a certificate and renews it before it expires and when
// the Node's addresses change, until ctx ends. A CSR that is denied or
// fails is logged and asked again with backoff, while the current
// certificate goes on serving.
func (s *servingCert) run(ctx context.Context, changed <-chan struct{}) {
	r := csr.Rotator{
		What: "serving certificate",
		Current: func() *x509.Certificate {
			if c := s.issued.Load(); c != nil {
				return c.Leaf
			}
			return nil
		},
		Renew: s.renew,
		Stale: s.stale,
		Wake:  changed,
		Now:   s.now,
		Check: s.check,
		Log:   s.log,
	}
	r.Run(ctx)
}

func (s *servingCert) renew(ctx context.Context) error {
	hosts := addresses(s.node.Node())
	if len(hosts) == 0 {
		return errors.New("the Node has no addresses yet")
	}
	dns, ips := sans(hosts)
	s.log.Info("requesting a serving certificate", "dns", dns, "ips", ips)
	cert, err := csr.Get(ctx, s.csrs, csr.Spec{
		NodeName: s.nodeName,
		Signer:   certv1.KubeletServingSignerName,
		// An ECDSA key: no key encipherment.
		Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
		DNSNames:   dns,
		IPs:        ips,
		NamePrefix: "csr-serving-",
	}, s.file, s.now, s.log)
	if err != nil {
		return err
	}
	s.log.Info("got a serving certificate", "serial", cert.Leaf.SerialNumber, "expires", cert.Leaf.NotAfter, "file", s.file)
	s.issued.Store(cert)
	return nil
}

// stale reports whether leaf is for other addresses than the Node's.
func (s *servingCert) stale(leaf *x509.Certificate) bool {
	hosts := addresses(s.node.Node())
	if len(hosts) == 0 {
		return false // nothing to ask for yet
	}
	dns, ips := sans(hosts)
	have, haveIPs := sans(append(slices.Clone(leaf.DNSNames), ipStrings(leaf.IPAddresses)...))
	return !slices.Equal(dns, have) || !slices.EqualFunc(ips, haveIPs, net.IP.Equal)
}

func ipStrings(ips []net.IP) []string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return s
}
