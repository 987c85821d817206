package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cairn-os/cairn/internal/controlplane"
	"github.com/cairn-os/cairn/test/poll"
)

// TestMain runs the tests under Main, with a dual-stack Service range for
// the shared cluster, and then checks that no process is left: neither the
// clusters of Start nor the shared one.
func TestMain(m *testing.M) {
	code := Main(m, Options{ServiceCIDR: "10.102.0.0/24,fd00:10:102::/112"})
	if kids := children(nil); len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: processes left running after the tests: %v\n", kids)
		code = 1
	}
	os.Exit(code)
}

// TestCluster starts the control plane and checks what node agent tests
// rely on: objects round-trip, kube-controller-manager runs, the bootstrap
// token authenticates and gets a kubelet client certificate signed by the
// cluster CA, the API server survives a restart with its data, and Stop
// leaves no process or listener behind.
func TestCluster(t *testing.T) {
	c := Start(t, Options{})
	ctx := t.Context()
	const ns = "cairn-kube-test"

	t.Run("objects", func(t *testing.T) {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
		want := map[string]string{"node": "cairn"}
		if _, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "config"}, Data: want,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create configmap: %v", err)
		}
		got, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "config", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get configmap: %v", err)
		}
		if diff := cmp.Diff(want, got.Data); diff != "" {
			t.Errorf("configmap data (-want +got):\n%s", diff)
		}
	})

	// Cairn nodes read, with their own credentials, what kube-proxy and a
	// NetworkPolicy controller read.
	t.Run("node permissions", func(t *testing.T) {
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Verb: "list", Resource: "services"},
			{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
			{Verb: "list", Resource: "pods"},
			{Verb: "watch", Resource: "namespaces"},
			{Verb: "list", Group: "networking.k8s.io", Resource: "networkpolicies"},
		} {
			r, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: "system:node:n1", Groups: []string{"system:nodes", "system:authenticated"}, ResourceAttributes: &ra},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !r.Status.Allowed {
				t.Errorf("a node may not %s %s.%s: %s", ra.Verb, ra.Resource, ra.Group, r.Status.Reason)
			}
		}
	})

	t.Run("controller-manager", func(t *testing.T) {
		poll.Until(t, 30*time.Second, "default ServiceAccount in "+ns+" (kube-controller-manager runs)", func() error {
			_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err
		})
	})

	t.Run("kubeconfig", func(t *testing.T) {
		// The file that other programs (kubectl, the agent) get works too.
		cs := clientFor(t, kubeconfigConfig(t, c.AdminKubeconfig))
		if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Errorf("get namespace through %s: %v", c.AdminKubeconfig, err)
		}
		info, err := cs.Discovery().ServerVersion()
		if err != nil {
			t.Fatalf("server version: %v", err)
		}
		if info.GitVersion != "v1.37.2" || info.Major != "1" || info.Minor != "37" {
			t.Errorf("server version = %s (major %q, minor %q), want v1.37.2: build flags of hack/build-cluster.sh",
				info.GitVersion, info.Major, info.Minor)
		}
	})

	t.Run("bootstrap token", func(t *testing.T) {
		boot := clientFor(t, c.BootstrapConfig())
		r, err := boot.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review with the bootstrap token: %v", err)
		}
		id, _, _ := strings.Cut(c.BootstrapToken, ".")
		u := r.Status.UserInfo
		if u.Username != "system:bootstrap:"+id || !slices.Contains(u.Groups, "system:bootstrappers") ||
			!slices.Contains(u.Groups, BootstrapGroup) {
			t.Errorf("bootstrap token authenticates as %s in %v, want system:bootstrap:%s in system:bootstrappers and %s",
				u.Username, u.Groups, id, BootstrapGroup)
		}
		bootFile := clientFor(t, kubeconfigConfig(t, c.BootstrapKubeconfig))
		if _, err := bootFile.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err != nil {
			t.Errorf("self subject review through %s: %v", c.BootstrapKubeconfig, err)
		}
		// bootstrapsigner (kube-controller-manager) signs cluster-info with the token.
		poll.Until(t, 30*time.Second, "cluster-info signed", func() error {
			cm, err := c.Client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, "cluster-info", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, ok := cm.Data["jws-kubeconfig-"+id]; !ok {
				return fmt.Errorf("no jws-kubeconfig-%s", id)
			}
			return nil
		})
	})

	t.Run("kubelet client CSR", func(t *testing.T) {
		const node = "cairn-test-node"
		boot := clientFor(t, c.BootstrapConfig())
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		csr, err := boot.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
				SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
				Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create CSR with the bootstrap token: %v", err)
		}
		var certPEM []byte
		poll.Until(t, 30*time.Second, "CSR "+csr.Name+" approved and signed", func() error {
			got, err := boot.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if certPEM = got.Status.Certificate; len(certPEM) == 0 {
				return errors.New("no certificate yet")
			}
			return nil
		})
		block, _ := pem.Decode(certPEM)
		if block == nil {
			t.Fatalf("CSR certificate is not PEM: %q", certPEM)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(c.CAPEM)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("the signed certificate does not chain to the cluster CA: %v", err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		nodeClient := clientFor(t, &rest.Config{Host: c.URL, TLSClientConfig: rest.TLSClientConfig{
			CAData: c.CAPEM, CertData: certPEM,
			KeyData: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		}})
		r, err := nodeClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review with the signed certificate: %v", err)
		}
		if u := r.Status.UserInfo; u.Username != "system:node:"+node || !slices.Contains(u.Groups, "system:nodes") {
			t.Errorf("signed certificate authenticates as %s in %v, want system:node:%s in system:nodes", u.Username, u.Groups, node)
		}
	})

	t.Run("user config", func(t *testing.T) {
		node := clientFor(t, c.UserConfig("system:node:other", "system:nodes"))
		_, err := node.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
		if err == nil {
			t.Error("a node may list kube-system's Secrets, want forbidden (Node,RBAC authorization)")
		}
	})

	t.Run("apiserver restart", func(t *testing.T) {
		c.StopAPIServer()
		if port, _ := c.Ports(); listening(port) {
			t.Errorf("port %d still accepts connections after StopAPIServer", port)
		}
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Client.CoreV1().ConfigMaps(ns).Get(short, "config", metav1.GetOptions{})
		cancel()
		if err == nil {
			t.Error("get configmap with the API server stopped succeeded")
		}
		c.StartAPIServer()
		got, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "config", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get configmap after the restart with the same client: %v", err)
		}
		if got.Data["node"] != "cairn" {
			t.Errorf("configmap after the restart = %v, want node=cairn", got.Data)
		}
		c.RestartAPIServer()
		if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Errorf("get namespace after RestartAPIServer: %v", err)
		}
		// kube-controller-manager reconnects: a new namespace gets its
		// default ServiceAccount.
		const ns2 = "cairn-kube-test-restarted"
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns2}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s after the restart: %v", ns2, err)
		}
		poll.Until(t, 30*time.Second, "default ServiceAccount in "+ns2+" (kube-controller-manager after the API server restarts)", func() error {
			_, err := c.Client.CoreV1().ServiceAccounts(ns2).Get(ctx, "default", metav1.GetOptions{})
			return err
		})
	})

	t.Run("stop", func(t *testing.T) {
		ps := c.Processes()
		c.Stop()
		for _, p := range ps {
			if controlplane.Alive(p.PID) {
				t.Errorf("%s (pid %d) still runs after Stop", p.Name, p.PID)
			}
		}
		apiPort, etcdPort := c.Ports()
		for _, port := range []int{apiPort, etcdPort} {
			if listening(port) {
				t.Errorf("port %d still accepts connections after Stop", port)
			}
		}
		if kids := children(sharedPIDs()); len(kids) > 0 {
			t.Errorf("processes left behind by Stop: %v", kids)
		}
		c.Stop() // a second Stop, and the one in Cleanup, do nothing
	})
}

func clientFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func kubeconfigConfig(t *testing.T, path string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return cfg
}

// children returns the "pid comm" of each live process whose parent is
// this test binary, but for those in except.
func children(except map[int]bool) []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	self := strconv.Itoa(os.Getpid())
	var kids []string
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
		line := string(b)
		i := strings.LastIndexByte(line, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(line[i+1:])
		if pid, _ := strconv.Atoi(strings.Fields(line)[0]); len(f) > 1 && f[1] == self && !except[pid] {
			kids = append(kids, line[:i+1])
		}
	}
	return kids
}

// TestOptions checks the options that change what runs: a pod CIDR makes
// kube-controller-manager give a new Node its range, the scheduler runs,
// and the API server's certificate names the extra address.
func TestOptions(t *testing.T) {
	c := Start(t, Options{ServiceCIDR: "10.100.0.0/24", PodCIDR: "10.244.0.0/16", Scheduler: true, ServingIPs: []net.IP{net.IPv4(10, 0, 2, 2)}})
	ctx := t.Context()
	conn, err := tls.Dial("tcp", strings.TrimPrefix(c.URL, "https://"), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := conn.ConnectionState().PeerCertificates[0].VerifyHostname("10.0.2.2"); err != nil {
		t.Errorf("API server certificate: %v, want it valid for 10.0.2.2", err)
	}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cairn-test-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	var cidr string
	poll.Until(t, 30*time.Second, "node pod CIDR", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "cairn-test-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cidr = n.Spec.PodCIDR; cidr == "" {
			return errors.New("no pod CIDR yet")
		}
		return nil
	})
	if !strings.HasPrefix(cidr, "10.244.") {
		t.Errorf("node pod CIDR = %s, want a range of 10.244.0.0/16", cidr)
	}
	svc, err := c.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the kubernetes Service: %v", err)
	}
	if svc.Spec.ClusterIP != "10.100.0.1" {
		t.Errorf("kubernetes Service IP = %s, want 10.100.0.1 (first of ServiceCIDR)", svc.Spec.ClusterIP)
	}
	for _, p := range c.Processes() {
		if p.Name == "kube-scheduler" {
			return
		}
	}
	t.Error("kube-scheduler was not started")
}

// TestShared checks the cluster that tests share: the same one for every
// test, a namespace of its own for each that goes when the test ends, and
// the dual-stack Service range of Main's options.
func TestShared(t *testing.T) {
	c := Shared(t)
	ctx := t.Context()
	var urls, namespaces []string
	for _, name := range []string{"first", "second"} {
		t.Run(name, func(t *testing.T) {
			c := Shared(t)
			ns := c.Namespace()
			urls, namespaces = append(urls, c.URL), append(namespaces, ns)
			if _, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "config"}, Data: map[string]string{"test": name},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create configmap in %s: %v", ns, err)
			}
		})
	}
	if len(urls) != 2 {
		t.Fatalf("the subtests did not run: %v", urls)
	}
	if urls[0] != urls[1] || urls[0] != c.URL {
		t.Errorf("the tests got clusters at %v and this test at %s, want one shared cluster", urls, c.URL)
	}
	if namespaces[0] == namespaces[1] || !strings.HasPrefix(namespaces[0], "testshared-first-") {
		t.Errorf("namespaces of the subtests = %v, want two named after the tests", namespaces)
	}
	for _, ns := range namespaces {
		got, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err == nil && got.DeletionTimestamp == nil {
			t.Errorf("namespace %s of an ended test is not being deleted", ns)
		}
	}

	ns := c.Namespace()
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: ptr(corev1.IPFamilyPolicyRequireDualStack),
			Ports:          []corev1.ServicePort{{Port: 80}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a dual-stack Service: %v", err)
	}
	if ips := svc.Spec.ClusterIPs; len(ips) != 2 || !strings.HasPrefix(ips[0], "10.102.0.") || !strings.HasPrefix(ips[1], "fd00:10:102::") {
		t.Errorf("dual-stack Service got ClusterIPs %v, want one of 10.102.0.0/24 and one of fd00:10:102::/112", ips)
	}
	k, err := c.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the kubernetes Service: %v", err)
	}
	if k.Spec.ClusterIP != "10.102.0.1" {
		t.Errorf("kubernetes Service IP = %s, want 10.102.0.1 (first of the primary range)", k.Spec.ClusterIP)
	}
}

func ptr[T any](v T) *T { return &v }

// listening reports whether something accepts TCP connections on
// 127.0.0.1:port.
func listening(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
