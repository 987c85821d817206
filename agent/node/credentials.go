package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cairn-os/cairn/agent/node/csr"
	"github.com/cairn-os/cairn/machineconfig"
)

type credentialsConfig struct {
	cluster  *machineconfig.Cluster
	nodeName string
	file     string // the stored key and certificate, PEM
	agent    string // User-Agent
	now      func() time.Time
	check    time.Duration // how often rotate looks at the clock
	log      *slog.Logger
}

// credentials are the node's identity towards the API server: either the
// kubeconfig of the machine config, used as it is, or a client certificate
// from TLS bootstrapping, which rotate renews. The node's client presents
// whichever certificate is current at each TLS handshake, and a new
// certificate closes the connections made with the old one, so that
// clients pick it up without being made again.
type credentials struct {
	credentialsConfig
	kubeconfig *rest.Config // nil with a bootstrap token

	cert      atomic.Pointer[tls.Certificate] // Leaf is set
	conns     connTracker
	transport *http.Transport
	// checks counts rotate's looks at the clock, which tells a test that
	// a renewal had its chances.
	checks atomic.Uint64
}

func newCredentials(c credentialsConfig) (*credentials, error) {
	cr := &credentials{credentialsConfig: c}
	cr.conns.dialer = net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if c.cluster.Kubeconfig != "" {
		rc, err := clientcmd.RESTConfigFromKubeConfig([]byte(c.cluster.Kubeconfig))
		if err != nil {
			return nil, fmt.Errorf("cluster.kubeconfig: %w", err)
		}
		rc.UserAgent = c.agent
		cr.kubeconfig = rc
		return cr, nil
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(c.cluster.CA)) {
		return nil, errors.New("cluster.ca: no PEM certificate")
	}
	cr.transport = &http.Transport{
		DialContext: cr.conns.dialContext,
		TLSClientConfig: &tls.Config{
			RootCAs:              roots,
			GetClientCertificate: cr.clientCertificate,
			MinVersion:           tls.VersionTLS12,
		},
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 25,
		// Find a dead connection to an API server that went away without
		// closing it.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
	}
	return cr, nil
}

// rotates reports whether the credentials are a certificate that rotate
// renews.
func (c *credentials) rotates() bool { return c.kubeconfig == nil }

// The node's client writes a status per pod change: client-go's default of
// 5 requests a second queued 50 pods starting at once behind each other
// for 10 s. The kubelet allows 50, in bursts of 100.
const (
	clientQPS   = 50
	clientBurst = 100
)

// restConfig returns the configuration of the node's client.
func (c *credentials) restConfig() *rest.Config {
	var rc *rest.Config
	if c.kubeconfig != nil {
		rc = rest.CopyConfig(c.kubeconfig)
	} else {
		rc = &rest.Config{Host: c.cluster.Server, Transport: c.transport, UserAgent: c.agent}
	}
	ClientSettings(rc)
	return rc
}

// ClientSettings sets how the node's client talks to the API server: its
// rate limits, and protobuf, as the kubelet speaks (lists of thousands of
// Services and EndpointSlices decode in a fraction of JSON's time and
// garbage).
func ClientSettings(rc *rest.Config) {
	rc.QPS, rc.Burst = clientQPS, clientBurst
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
}

// bootstrapClient returns a client that authenticates with the bootstrap
// token.
func (c *credentials) bootstrapClient() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(&rest.Config{
		Host:            c.cluster.Server,
		BearerToken:     c.cluster.BootstrapToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte(c.cluster.CA)},
		UserAgent:       c.agent,
	})
}

// init makes the credentials ready: the stored certificate if it is the
// node's and has not expired, else a new one by TLS bootstrapping.
func (c *credentials) init(ctx context.Context) error {
	if c.kubeconfig != nil {
		return nil
	}
	cert, err := csr.Load(c.file)
	if err == nil {
		err = csr.Usable(cert.Leaf, c.nodeName, c.now())
	}
	if err == nil {
		c.log.Info("using the stored client certificate", "file", c.file, "expires", cert.Leaf.NotAfter)
		c.set(cert)
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("stored client certificate unusable; bootstrapping a new one", "file", c.file, "err", err)
	}
	boot, err := c.bootstrapClient()
	if err != nil {
		return err
	}
	return c.renew(ctx, boot, "bootstrap token")
}

// renew asks for a new certificate with client, stores it and makes it
// current; as names the identity client authenticates with.
func (c *credentials) renew(ctx context.Context, client kubernetes.Interface, as string) error {
	c.log.Info("requesting a client certificate", "as", as)
	cert, err := csr.Get(ctx, client.CertificatesV1().CertificateSigningRequests(), csr.Spec{
		NodeName:   c.nodeName,
		Signer:     certv1.KubeAPIServerClientKubeletSignerName,
		Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		NamePrefix: "node-csr-",
	}, c.file, c.now, c.log)
	if err != nil {
		return err
	}
	c.log.Info("got a client certificate", "serial", cert.Leaf.SerialNumber, "expires", cert.Leaf.NotAfter, "file", c.file)
	c.set(cert)
	return nil
}

// set makes cert current and closes the connections that presented the
// previous one.
func (c *credentials) set(cert *tls.Certificate) {
	if c.cert.Swap(cert) != nil {
		c.conns.closeAll()
	}
}

func (c *credentials) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if cert := c.cert.Load(); cert != nil {
		return cert, nil
	}
	return &tls.Certificate{}, nil // none yet: the server sees an anonymous client
}

// connTracker dials connections and can close them all.
type connTracker struct {
	dialer net.Dialer
	mu     sync.Mutex
	conns  map[*trackedConn]bool
}

func (t *connTracker) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := t.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: conn, t: t}
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[*trackedConn]bool{}
	}
	t.conns[tc] = true
	t.mu.Unlock()
	return tc, nil
}

// closeAll closes every open connection; requests on them fail, and
// clients dial anew.
func (t *connTracker) closeAll() {
	t.mu.Lock()
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	t *connTracker
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}
