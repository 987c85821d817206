package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/node/csr"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// certEnv is a Node with the addresses 127.0.0.1 and its name, served by
// a kubelet server that gets its certificate from the cluster; the test
// approves or denies the CSRs.
type certEnv struct {
	c        *kube.Cluster
	node     string
	client   kubernetes.Interface // the node's
	nodes    *nodeSource
	certFile string
	// frozen, if set, is the server's clock.
	frozen atomic.Pointer[time.Time]
}

func newCertEnv(t *testing.T) *certEnv {
	t.Helper()
	c := kube.Shared(t)
	e := &certEnv{c: c, node: "serving-" + c.Namespace(), certFile: filepath.Join(t.TempDir(), layout.KubeletServingCert)}
	var err error
	if e.client, err = kubernetes.NewForConfig(c.UserConfig(csr.NodeUserPrefix+e.node, csr.NodesGroup)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.Client.CoreV1().Nodes().Delete(ctx, e.node, metav1.DeleteOptions{})
		for _, r := range e.csrs(t) {
			_ = c.Client.CertificatesV1().CertificateSigningRequests().Delete(ctx, r.Name, metav1.DeleteOptions{})
		}
	})
	e.setAddresses(t, "127.0.0.1")
	f := node.NewInformers(e.client, e.node)
	e.nodes = &nodeSource{name: e.node, lister: f.Core().V1().Nodes().Lister(), informer: f.Core().V1().Nodes().Informer()}
	stop := make(chan struct{})
	f.Start(stop)
	f.WaitForCacheSync(t.Context().Done())
	t.Cleanup(func() { close(stop); f.Shutdown() })
	return e
}

// setAddresses makes the Node's addresses its name and ips.
func (e *certEnv) setAddresses(t *testing.T, ips ...string) {
	t.Helper()
	addrs := []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: e.node}}
	for _, ip := range ips {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	e.patchStatus(t, corev1.NodeStatus{Addresses: addrs})
}

// patchStatus merges status into the Node's, as agent/node does.
func (e *certEnv) patchStatus(t *testing.T, status corev1.NodeStatus) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Nodes().Patch(t.Context(), e.node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// serve starts a server for the Node on a new port, with what else cfg
// has, and returns its address; it stops at the test's end.
func (e *certEnv) serve(t *testing.T, cfg Config) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.NodeName, cfg.Client, cfg.ClusterCA, cfg.Node, cfg.CertFile = e.node, e.client, e.c.CAPEM, e.nodes, e.certFile
	cfg.now = func() time.Time {
		if t := e.frozen.Load(); t != nil {
			return *t
		}
		return time.Now()
	}
	cfg.certCheck = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve() = %v, want nil once its context ended", err)
		}
	})
	return l.Addr().String()
}

// csrs are the node's kubelet-serving CSRs.
func (e *certEnv) csrs(t *testing.T) []certv1.CertificateSigningRequest {
	t.Helper()
	list, err := e.c.Client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []certv1.CertificateSigningRequest
	for _, r := range list.Items {
		if r.Spec.SignerName == certv1.KubeletServingSignerName && r.Spec.Username == csr.NodeUserPrefix+e.node {
			out = append(out, r)
		}
	}
	return out
}

// pending waits until the node made n CSRs and returns the one that
// has no decision yet. (Creation times count seconds: they do not order
// the CSRs of one second.)
func (e *certEnv) pending(t *testing.T, n int) *certv1.CertificateSigningRequest {
	t.Helper()
	var r *certv1.CertificateSigningRequest
	poll.Until(t, 20*time.Second, fmt.Sprintf("CSR %d of %s", n, e.node), func() error {
		csrs := e.csrs(t)
		if len(csrs) < n {
			return fmt.Errorf("%d CSRs", len(csrs))
		}
		if len(csrs) > n {
			t.Fatalf("%d CSRs, want %d", len(csrs), n)
		}
		var undecided []certv1.CertificateSigningRequest
		for _, c := range csrs {
			if len(c.Status.Conditions) == 0 {
				undecided = append(undecided, c)
			}
		}
		if len(undecided) != 1 {
			t.Fatalf("%d of %d CSRs without a decision, want 1", len(undecided), n)
		}
		r = &undecided[0]
		return nil
	})
	return r
}

// decide approves or denies r, as an approver does.
func (e *certEnv) decide(t *testing.T, r *certv1.CertificateSigningRequest, approve bool) {
	t.Helper()
	cond := certv1.CertificateSigningRequestCondition{Type: certv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "TestApproved", Message: "the test approves the node's serving certificate"}
	if !approve {
		cond.Type, cond.Reason, cond.Message = certv1.CertificateDenied, "TestDenied", "the test denies it"
	}
	r.Status.Conditions = append(r.Status.Conditions, cond)
	if _, err := e.c.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(t.Context(), r.Name, r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dial connects to addr verifying the server's certificate against the
// cluster CA for the server name 127.0.0.1, or without verifying if
// verify is false, and returns the connection and the certificate.
func (e *certEnv) dial(addr string, verify bool) (*tls.Conn, *x509.Certificate, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.c.CAPEM)
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", InsecureSkipVerify: !verify})
	if err != nil {
		return nil, nil, err
	}
	return conn, conn.ConnectionState().PeerCertificates[0], nil
}

// served returns the certificate a connection to addr sees, unverified.
func (e *certEnv) served(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, leaf, err := e.dial(addr, false)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	return leaf
}

// waitIssued waits until a connection to addr verifies against the
// cluster CA with a certificate other than not's, and returns it.
func (e *certEnv) waitIssued(t *testing.T, addr string, not *x509.Certificate) *x509.Certificate {
	t.Helper()
	var leaf *x509.Certificate
	poll.Until(t, 20*time.Second, "the cluster's serving certificate", func() error {
		conn, l, err := e.dial(addr, true)
		if err != nil {
			return err
		}
		conn.Close()
		if not != nil && l.SerialNumber.Cmp(not.SerialNumber) == 0 {
			return errors.New("still the old certificate")
		}
		leaf = l
		return nil
	})
	return leaf
}

func isSelfSigned(leaf *x509.Certificate, node string) bool {
	return strings.HasPrefix(leaf.Subject.CommonName, node+"@") && leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature) == nil
}

func sansOf(leaf *x509.Certificate) []string {
	s := slices.Clone(leaf.DNSNames)
	for _, ip := range leaf.IPAddresses {
		s = append(s, ip.String())
	}
	slices.Sort(s)
	return s
}

// get writes a request on conn and returns the response's status line:
// the connection still serves.
func get(conn *tls.Conn) (string, error) {
	if _, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	return resp.Status, nil
}

// TestServingCertificate follows the serving certificate through its
// life: self-signed until the cluster issues one, the cluster's for the
// Node's addresses once the CSR is approved, a new one at its deadline
// without a new listener, a new one when the addresses change, and the
// stored one at the next start.
func TestServingCertificate(t *testing.T) {
	e := newCertEnv(t)
	addr := e.serve(t, Config{})
	if leaf := e.served(t, addr); !isSelfSigned(leaf, e.node) {
		t.Fatalf("before an approval the server serves %q issued by %q, want a self-signed certificate", leaf.Subject, leaf.Issuer)
	}

	r := e.pending(t, 1)
	block, _ := pem.Decode(r.Spec.Request)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if want := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}; !slices.Equal(r.Spec.Usages, want) {
		t.Errorf("CSR usages %v, want %v", r.Spec.Usages, want)
	}
	if req.Subject.CommonName != "system:node:"+e.node || !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("CSR subject %v, want system:node:%s in system:nodes", req.Subject, e.node)
	}
	e.decide(t, r, true)
	first := e.waitIssued(t, addr, nil)
	if got, want := sansOf(first), []string{"127.0.0.1", e.node}; !slices.Equal(got, want) {
		t.Errorf("issued certificate for %v, want the Node's addresses %v", got, want)
	}

	// At its deadline a new certificate is asked for; a connection made
	// with the old one goes on.
	conn, _, err := e.dial(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	at := csr.Deadline(first)
	e.frozen.Store(&at)
	r = e.pending(t, 2)
	e.frozen.Store(nil) // the new certificate is not due at once
	e.decide(t, r, true)
	second := e.waitIssued(t, addr, first)
	if status, err := get(conn); err != nil || status != "401 Unauthorized" {
		t.Errorf("connection made before the rotation: %q, %v; want it to go on serving (401 without credentials)", status, err)
	}

	// New addresses, new certificate.
	e.setAddresses(t, "127.0.0.1", "127.0.0.2")
	e.decide(t, e.pending(t, 3), true)
	third := e.waitIssued(t, addr, second)
	if got, want := sansOf(third), []string{"127.0.0.1", "127.0.0.2", e.node}; !slices.Equal(got, want) {
		t.Errorf("certificate after the addresses changed is for %v, want %v", got, want)
	}

	// The next start serves the stored certificate at once.
	stored, err := csr.Load(e.certFile)
	if err != nil || stored.Leaf.SerialNumber.Cmp(third.SerialNumber) != 0 {
		t.Fatalf("stored certificate %v, %v; want the current one %v", stored, err, third.SerialNumber)
	}
	addr2 := e.serve(t, Config{})
	if leaf := e.served(t, addr2); leaf.SerialNumber.Cmp(third.SerialNumber) != 0 {
		t.Errorf("a new server serves %q, want the stored certificate", leaf.Subject)
	}
	if n := len(e.csrs(t)); n != 3 {
		t.Errorf("%d CSRs after a restart, want still 3", n)
	}
}

// TestServingCertificateDenied shows that a denied CSR leaves the
// self-signed certificate serving, and that the server asks again.
func TestServingCertificateDenied(t *testing.T) {
	e := newCertEnv(t)
	addr := e.serve(t, Config{})
	e.decide(t, e.pending(t, 1), false)
	// The retry waits a second: the self-signed one serves meanwhile.
	r := e.pending(t, 2)
	if leaf := e.served(t, addr); !isSelfSigned(leaf, e.node) {
		t.Errorf("after a denial the server serves %q issued by %q, want the self-signed certificate", leaf.Subject, leaf.Issuer)
	}
	e.decide(t, r, true)
	e.waitIssued(t, addr, nil)
}

// nodeSource is the Node of an informer: what *node.Member gives the
// server.
type nodeSource struct {
	name     string
	lister   corelisters.NodeLister
	informer toolscache.SharedIndexInformer
}

func (s *nodeSource) Node() *corev1.Node {
	n, err := s.lister.Get(s.name)
	if err != nil {
		return &corev1.Node{}
	}
	return n
}

func (s *nodeSource) NodeChanged() (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	reg, err := s.informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }})
	if err != nil {
		return nil, nil, err
	}
	return ch, func() { _ = s.informer.RemoveEventHandler(reg) }, nil
}
