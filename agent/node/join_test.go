package node

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cairn-os/cairn/agent/node/csr"
	"github.com/cairn-os/cairn/agent/node/host"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// fakeRuntime is the container runtime as the tests want it.
type fakeRuntime struct {
	mu                         sync.Mutex
	runtimeReady, networkReady bool
	reason                     string
}

func (f *fakeRuntime) RuntimeVersion(context.Context) (string, error) {
	return "containerd://2.4.2-test", nil
}

func (f *fakeRuntime) RuntimeStatus(context.Context) (bool, bool, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runtimeReady, f.networkReady, f.reason, nil
}

func (f *fakeRuntime) set(runtimeReady, networkReady bool, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runtimeReady, f.networkReady, f.reason = runtimeReady, networkReady, reason
}

// agent is a running membership of a test.
type agent struct {
	j      *joiner
	rt     *fakeRuntime
	cancel context.CancelFunc
	done   chan struct{}
}

// stop stops the agent and waits until everything it started returned.
func (a *agent) stop() {
	a.cancel()
	<-a.done
}

// testConfig returns the config of a node called name that joins c with
// the bootstrap token, keeping its state in dir, and renews and reports
// every 200 ms.
func testConfig(t *testing.T, c *kube.Cluster, name, dir string) Config {
	return Config{
		NodeName: name,
		Cluster: machineconfig.Cluster{
			Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
			ClusterDomain: machineconfig.DefaultClusterDomain,
		},
		Dir:            dir,
		Version:        "test",
		Log:            slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("test", t.Name()),
		LeaseInterval:  200 * time.Millisecond,
		StatusInterval: 200 * time.Millisecond,
	}
}

// start runs the membership of cfg (with a ready runtime unless cfg has
// one) and components until the test ends or stop.
func start(t *testing.T, cfg Config, components ...Component) *agent {
	t.Helper()
	rt := &fakeRuntime{runtimeReady: true, networkReady: true}
	if cfg.RuntimeInfo == nil {
		cfg.RuntimeInfo, cfg.RuntimeStatus = rt, rt
	}
	j, err := newJoiner(cfg)
	if err != nil {
		t.Fatalf("newJoiner() = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{j: j, rt: rt, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		j.run(ctx, components)
	}()
	t.Cleanup(a.stop)
	return a
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func getNode(t *testing.T, c *kube.Cluster, name string) *corev1.Node {
	t.Helper()
	var node *corev1.Node
	poll.Until(t, 20*time.Second, "Node "+name, func() (err error) {
		node, err = c.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		return err
	})
	return node
}

// csrsOf returns the CSRs for the client certificate of node name.
func csrsOf(t *testing.T, c *kube.Cluster, name string) []certv1.CertificateSigningRequest {
	t.Helper()
	list, err := c.Client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var csrs []certv1.CertificateSigningRequest
	for _, item := range list.Items {
		block, _ := pem.Decode(item.Spec.Request)
		if block == nil {
			continue
		}
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err == nil && req.Subject.CommonName == "system:node:"+name {
			csrs = append(csrs, item)
		}
	}
	slices.SortFunc(csrs, func(a, b certv1.CertificateSigningRequest) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return csrs
}

func whoAmI(t *testing.T, cs kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

func lease(t *testing.T, c *kube.Cluster, name string) (*metav1.MicroTime, error) {
	l, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return l.Spec.RenewTime, nil
}

// waitRenewedAfter waits until the Lease of name was renewed after t0.
func waitRenewedAfter(t *testing.T, c *kube.Cluster, name string, t0 time.Time, timeout time.Duration) {
	t.Helper()
	poll.Until(t, timeout, "Lease renewed after "+t0.Format(time.StampMilli), func() error {
		rt, err := lease(t, c, name)
		if err != nil {
			return err
		}
		if rt == nil || !rt.After(t0) {
			return errors.New("not renewed yet")
		}
		return nil
	})
}

// TestJoin joins nodes to a real control plane.
func TestJoin(t *testing.T) {
	c := kube.Start(t, kube.Options{})

	t.Run("bootstrap", func(t *testing.T) { testBootstrap(t, c) })
	t.Run("restart reuses the certificate", func(t *testing.T) { testRestart(t, c) })
	t.Run("rotation", func(t *testing.T) { testRotation(t, c) })
	t.Run("kubeconfig", func(t *testing.T) { testKubeconfig(t, c) })
	t.Run("adopt", func(t *testing.T) { testAdopt(t, c) })
	t.Run("status", func(t *testing.T) { testStatus(t, c) })
	t.Run("no needless writes", func(t *testing.T) { testQuiet(t, c) })
	t.Run("lease", func(t *testing.T) { testLease(t, c) })
	t.Run("joined", func(t *testing.T) { testJoined(t, c) })
}

// testJoined wants the components to get, once the Node is registered,
// a Member: a client with the node's own credentials that may read what
// the Service dataplane needs, and the Node as watched.
func testJoined(t *testing.T, c *kube.Cluster) {
	const name = "joined-1"
	cfg := testConfig(t, c, name, t.TempDir())
	cfg.NodeIP, cfg.KubeletPort = netip.MustParseAddr("127.0.0.1"), 10350
	got := make(chan *Member, 1)
	start(t, cfg, Component{Name: "test", Run: func(ctx context.Context, m *Member) error {
		got <- m
		<-ctx.Done()
		return nil
	}})
	var m *Member
	select {
	case m = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("component not started within 30 s")
	}
	node := m.Node()
	if m.Name != name || node.Name != name {
		t.Errorf("Member %s with Node %s; want %s as registered", m.Name, node.Name, name)
	}
	// The configured node IP is the one InternalIP, and the API server
	// finds the kubelet server's port.
	wantAddrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}}
	if diff := cmp.Diff(wantAddrs, node.Status.Addresses); diff != "" {
		t.Errorf("Node addresses mismatch (-want +got):\n%s", diff)
	}
	if p := node.Status.DaemonEndpoints.KubeletEndpoint.Port; p != 10350 {
		t.Errorf("Node daemonEndpoints.kubeletEndpoint.port = %d, want 10350", p)
	}
	if string(m.ClusterCA) != string(c.CAPEM) {
		t.Errorf("Member.ClusterCA = %q, want the cluster CA", m.ClusterCA)
	}
	ctx := context.Background()
	if _, err := m.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node client lists Services: %v", err)
	}
	if _, err := m.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node client lists EndpointSlices: %v", err)
	}
	if _, err := m.Client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("node client lists kube-system Secrets, want it forbidden: the client must be the node's, not an admin's")
	}

	// A change of the Node is told, and Node returns it.
	changed, stop, err := m.NodeChanged()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	label := []byte(`{"metadata":{"labels":{"example.com/seen":"yes"}}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, label, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for m.Node().Labels["example.com/seen"] != "yes" {
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("Node labels %v 10 s after the patch, want example.com/seen=yes", m.Node().Labels)
		}
	}
	// The member's informers list as the node: the Pods only with the
	// node's field selector, which is all the Node authorizer allows.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), m.Informers.Core().V1().Pods().Informer().HasSynced,
		m.Informers.Core().V1().Services().Informer().HasSynced,
		m.Informers.Discovery().V1().EndpointSlices().Informer().HasSynced) {
		t.Fatal("the member's informers did not sync within 10 s")
	}
}

func testBootstrap(t *testing.T, c *kube.Cluster) {
	const name = "boot-1"
	cfg := testConfig(t, c, name, t.TempDir())
	cfg.Cluster.NodeLabels = map[string]string{"example.com/rack": "r1", "node.kubernetes.io/pool": "blue"}
	cfg.Cluster.NodeTaints = []machineconfig.Taint{{Key: "example.com/dedicated", Value: "db", Effect: "NoSchedule"}}
	cfg.Cluster.PodCIDR = "10.244.7.0/24"
	a := start(t, cfg)
	node := getNode(t, c, name)

	// The certificate came from the CSR flow, asked for with the token.
	csrs := csrsOf(t, c, name)
	if len(csrs) != 1 {
		t.Fatalf("%d CSRs for %s, want 1", len(csrs), name)
	}
	req := csrs[0]
	tokenID, _, _ := strings.Cut(c.BootstrapToken, ".")
	if req.Spec.Username != "system:bootstrap:"+tokenID || req.Spec.SignerName != certv1.KubeAPIServerClientKubeletSignerName ||
		!slices.Equal(req.Spec.Usages, []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}) {
		t.Errorf("CSR by %q to %q for %v, want by the bootstrap token to the kubelet client signer for digital signature and client auth",
			req.Spec.Username, req.Spec.SignerName, req.Spec.Usages)
	}
	stored, err := csr.Load(filepath.Join(cfg.Dir, "pki", "client.pem"))
	if err != nil {
		t.Fatalf("stored certificate: %v", err)
	}
	leaf := stored.Leaf
	if leaf.Subject.CommonName != "system:node:"+name || !slices.Equal(leaf.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("certificate subject = %v, want CN=system:node:%s, O=system:nodes", leaf.Subject, name)
	}
	if want := req.Status.Certificate; string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})) != string(want) {
		t.Errorf("stored certificate is not the one the CSR issued")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("certificate does not chain to the cluster CA for client auth: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(cfg.Dir, "pki", "client.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stored certificate mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}

	// The Node, as the host is.
	wantLabels := map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": runtime.GOOS, "kubernetes.io/arch": runtime.GOARCH,
		"example.com/rack": "r1", "node.kubernetes.io/pool": "blue",
	}
	if diff := cmp.Diff(wantLabels, nodeLabels(node)); diff != "" {
		t.Errorf("Node labels mismatch (-want +got):\n%s", diff)
	}
	wantTaints := []corev1.Taint{{Key: "example.com/dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}
	if diff := cmp.Diff(wantTaints, nodeTaints(node)); diff != "" {
		t.Errorf("Node taints mismatch (-want +got):\n%s", diff)
	}
	if node.Spec.PodCIDR != "10.244.7.0/24" {
		t.Errorf("Node podCIDR = %q, want 10.244.7.0/24", node.Spec.PodCIDR)
	}
	addrs, err := host.Addresses()
	if err != nil {
		t.Fatal(err)
	}
	var wantAddrs []corev1.NodeAddress
	for _, a := range addrs {
		wantAddrs = append(wantAddrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	wantAddrs = append(wantAddrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	if diff := cmp.Diff(wantAddrs, node.Status.Addresses); diff != "" {
		t.Errorf("Node addresses mismatch (-want +got):\n%s", diff)
	}

	mem, _ := host.ReadMemory()
	fs, _ := host.StatFS(cfg.Dir)
	st := node.Status
	for _, q := range []struct {
		what      string
		got, want int64
	}{
		{"capacity cpu", st.Capacity.Cpu().MilliValue(), int64(runtime.NumCPU()) * 1000},
		{"allocatable cpu", st.Allocatable.Cpu().MilliValue(), int64(runtime.NumCPU())*1000 - 100},
		{"capacity memory", st.Capacity.Memory().Value(), int64(mem.Total)},
		{"allocatable memory", st.Allocatable.Memory().Value(), int64(mem.Total) - 356<<20},
		{"capacity pods", st.Capacity.Pods().Value(), 110},
		{"allocatable pods", st.Allocatable.Pods().Value(), 110},
		{"capacity ephemeral-storage", st.Capacity.StorageEphemeral().Value(), int64(fs.Size)},
		{"allocatable ephemeral-storage", st.Allocatable.StorageEphemeral().Value(), int64(fs.Size) - int64(fs.Size)/10},
	} {
		if q.got != q.want {
			t.Errorf("Node %s = %d, want %d", q.what, q.got, q.want)
		}
	}
	kernel, _ := host.KernelVersion()
	osImage, _ := host.OSImage()
	bootID, _ := host.BootID()
	machineID, err := host.MachineID()
	if err != nil {
		machineID = derivedMachineID(name)
	}
	wantInfo := corev1.NodeSystemInfo{
		MachineID: machineID, BootID: bootID, KernelVersion: kernel, OSImage: osImage,
		ContainerRuntimeVersion: "containerd://2.4.2-test", KubeletVersion: "v1.37.2+cairn.test",
		OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
	}
	if diff := cmp.Diff(wantInfo, st.NodeInfo); diff != "" {
		t.Errorf("Node nodeInfo mismatch (-want +got):\n%s", diff)
	}

	// The node's client is the node, and the Node authorizer holds it to
	// its own Node.
	cs := a.j.client
	if u := whoAmI(t, cs); u.Username != "system:node:"+name || !slices.Contains(u.Groups, "system:nodes") {
		t.Errorf("node client authenticates as %q in %v, want system:node:%s in system:nodes", u.Username, u.Groups, name)
	}
	ctx := context.Background()
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "boot-other"}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	label := []byte(`{"metadata":{"labels":{"example.com/by":"boot-1"}}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, "boot-other", types.MergePatchType, label, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node client patching another Node: %v, want Forbidden", err)
	}
	if _, err := cs.CoreV1().Nodes().PatchStatus(ctx, "boot-other", []byte(`{"status":{"conditions":[]}}`)); !apierrors.IsForbidden(err) {
		t.Errorf("node client patching another Node's status: %v, want Forbidden", err)
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, label, metav1.PatchOptions{}); err != nil {
		t.Errorf("node client patching its own Node: %v", err)
	}
	if _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name}); err != nil {
		t.Errorf("node client listing its pods: %v", err)
	}
}

// nodeLabels returns the labels of node but the beta OS and architecture
// labels that kube-controller-manager adds.
func nodeLabels(node *corev1.Node) map[string]string {
	l := map[string]string{}
	for k, v := range node.Labels {
		if !strings.HasPrefix(k, "beta.kubernetes.io/") {
			l[k] = v
		}
	}
	return l
}

// nodeTaints returns the taints of node but those that the control plane
// sets from conditions (node.kubernetes.io/not-ready at creation).
func nodeTaints(node *corev1.Node) []corev1.Taint {
	var ts []corev1.Taint
	for _, t := range node.Spec.Taints {
		if !strings.HasPrefix(t.Key, "node.kubernetes.io/") {
			ts = append(ts, t)
		}
	}
	return ts
}

func testRestart(t *testing.T, c *kube.Cluster) {
	const name = "restart-1"
	dir := t.TempDir()
	first := start(t, testConfig(t, c, name, dir))
	getNode(t, c, name)
	serial := first.j.creds.cert.Load().Leaf.SerialNumber
	first.stop()

	// A token that authenticates as no one: the second run must not need
	// it.
	cfg := testConfig(t, c, name, dir)
	cfg.Cluster.BootstrapToken = "aaaaaa.bbbbbbbbbbbbbbbb"
	restarted := time.Now()
	second := start(t, cfg)
	waitRenewedAfter(t, c, name, restarted, 10*time.Second)
	if got := second.j.creds.cert.Load().Leaf.SerialNumber; got.Cmp(serial) != 0 {
		t.Errorf("second run uses certificate %v, want the stored %v", got, serial)
	}
	if n := len(csrsOf(t, c, name)); n != 1 {
		t.Errorf("%d CSRs for %s after a restart, want the first run's 1", n, name)
	}
}

func testRotation(t *testing.T, c *kube.Cluster) {
	const name = "rotate-1"
	cfg := testConfig(t, c, name, t.TempDir())
	// The clock stands at the old certificate's deadline while it is
	// current: the new one's, drawn anew, may be earlier.
	type freeze struct {
		at  time.Time
		old *big.Int
	}
	var frozen atomic.Pointer[freeze]
	var a *agent
	cfg.now = func() time.Time {
		if f := frozen.Load(); f != nil && a.j.creds.cert.Load().Leaf.SerialNumber.Cmp(f.old) == 0 {
			return f.at
		}
		return time.Now()
	}
	cfg.certCheckInterval = 50 * time.Millisecond
	a = start(t, cfg)
	getNode(t, c, name)
	old := a.j.creds.cert.Load().Leaf
	if n := len(csrsOf(t, c, name)); n != 1 {
		t.Fatalf("%d CSRs for %s before rotation, want 1", n, name)
	}
	// Certificates count time in seconds: let a second pass, so that the
	// new certificate starts later than the old one, and move the clock
	// to the old one's deadline: the new one is renewed once, not again.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	at := csr.Deadline(old)
	t.Logf("certificate valid %v to %v; moving the clock to %v", old.NotBefore, old.NotAfter, at)
	frozen.Store(&freeze{at: at, old: old.SerialNumber})

	var cur *x509.Certificate
	poll.Until(t, 10*time.Second, "rotation", func() error {
		if cur = a.j.creds.cert.Load().Leaf; cur.SerialNumber.Cmp(old.SerialNumber) == 0 {
			return errors.New("still the old certificate")
		}
		return nil
	})
	csrs := csrsOf(t, c, name)
	if len(csrs) != 2 {
		t.Fatalf("%d CSRs for %s after rotation, want 2", len(csrs), name)
	}
	if u := csrs[1].Spec.Username; u != "system:node:"+name {
		t.Errorf("renewal CSR made by %q, want the node itself, system:node:%s", u, name)
	}
	if string(csrs[1].Status.Certificate) != string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cur.Raw})) {
		t.Errorf("current certificate is not the one the renewal CSR issued")
	}
	stored, err := csr.Load(filepath.Join(cfg.Dir, "pki", "client.pem"))
	if err != nil || stored.Leaf.SerialNumber.Cmp(cur.SerialNumber) != 0 {
		t.Errorf("stored certificate = %v, %v; want the new one %v", stored.Leaf.SerialNumber, err, cur.SerialNumber)
	}
	// The node's client, made before the rotation, goes on with the new
	// certificate (TestCertificateSwap shows that connections present it).
	rotated := time.Now()
	waitRenewedAfter(t, c, name, rotated, 5*time.Second)
	if u := whoAmI(t, a.j.client); u.Username != "system:node:"+name {
		t.Errorf("after rotation the node client authenticates as %q", u.Username)
	}
	waitCount(t, &a.j.creds.checks, 6, "looks at the clock by the rotation")
	if n := len(csrsOf(t, c, name)); n != 2 {
		t.Errorf("%d CSRs for %s a while after rotation, want still 2", n, name)
	}
}

func testKubeconfig(t *testing.T, c *kube.Cluster) {
	const name = "kubeconfig-1"
	user := c.UserConfig("system:node:"+name, "system:nodes")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kube"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.CAPEM}
	kc.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: user.CertData, ClientKeyData: user.KeyData}
	kc.Contexts["node"] = &clientcmdapi.Context{Cluster: "kube", AuthInfo: "node"}
	kc.CurrentContext = "node"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, c, name, t.TempDir())
	cfg.Cluster = machineconfig.Cluster{Kubeconfig: string(data), ClusterDomain: machineconfig.DefaultClusterDomain}
	// The machine config takes a kubeconfig as client-go writes it.
	var verr *machineconfig.ValidationError
	if err := (&machineconfig.Config{Cluster: &cfg.Cluster}).Validate(); errors.As(err, &verr) {
		for _, fe := range verr.Errors {
			if strings.HasPrefix(fe.Path, "cluster") {
				t.Errorf("machine config refuses the kubeconfig: %s: %s", fe.Path, fe.Msg)
			}
		}
	}
	a := start(t, cfg)
	getNode(t, c, name)
	waitRenewedAfter(t, c, name, time.Now(), 5*time.Second)
	if n := len(csrsOf(t, c, name)); n != 0 {
		t.Errorf("%d CSRs with a kubeconfig, want 0", n)
	}
	if u := whoAmI(t, a.j.client); u.Username != "system:node:"+name {
		t.Errorf("node client authenticates as %q, want system:node:%s", u.Username, name)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "pki")); !os.IsNotExist(err) {
		t.Errorf("pki directory with a kubeconfig: %v, want none", err)
	}
}

func testAdopt(t *testing.T, c *kube.Cluster) {
	const name = "adopt-1"
	ctx := context.Background()
	existing := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{"example.com/keep": "yes", "example.com/rack": "old"},
	}}
	existing, err := c.Client.CoreV1().Nodes().Create(ctx, existing, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, c, name, t.TempDir())
	cfg.Cluster.NodeLabels = map[string]string{"example.com/rack": "r2"}
	start(t, cfg)
	var node *corev1.Node
	poll.Until(t, 10*time.Second, "adopted Node with a Ready condition", func() (err error) {
		node, err = c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil && findCondition(node.Status.Conditions, corev1.NodeReady) == nil {
			err = errors.New("no Ready condition yet")
		}
		return err
	})
	if node.UID != existing.UID {
		t.Errorf("Node UID = %s, want the existing %s", node.UID, existing.UID)
	}
	want := map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": runtime.GOOS, "kubernetes.io/arch": runtime.GOARCH,
		"example.com/keep": "yes", "example.com/rack": "r2",
	}
	if diff := cmp.Diff(want, nodeLabels(node)); diff != "" {
		t.Errorf("adopted Node labels mismatch (-want +got):\n%s", diff)
	}
}

func testStatus(t *testing.T, c *kube.Cluster) {
	const name = "status-1"
	ctx := context.Background()
	cfg := testConfig(t, c, name, t.TempDir())
	cfg.StatusReportInterval = time.Second
	a := start(t, cfg)
	node := getNode(t, c, name)
	want := map[corev1.NodeConditionType]corev1.ConditionStatus{
		corev1.NodeReady: corev1.ConditionTrue, corev1.NodeMemoryPressure: corev1.ConditionFalse,
		corev1.NodeDiskPressure: corev1.ConditionFalse, corev1.NodePIDPressure: corev1.ConditionFalse,
		corev1.NodeNetworkUnavailable: corev1.ConditionFalse,
	}
	if diff := cmp.Diff(want, statuses(node)); diff != "" {
		t.Errorf("conditions of the new Node mismatch (-want +got):\n%s", diff)
	}
	ready0 := *findCondition(node.Status.Conditions, corev1.NodeReady)
	mem0 := *findCondition(node.Status.Conditions, corev1.NodeMemoryPressure)

	// Unchanged conditions are reported again, with new heartbeats only.
	poll.Until(t, 5*time.Second, "a heartbeat", func() error {
		node = getNode(t, c, name)
		if r := findCondition(node.Status.Conditions, corev1.NodeReady); !r.LastHeartbeatTime.After(ready0.LastHeartbeatTime.Time) {
			return errors.New("Ready heartbeat has not moved")
		}
		return nil
	})
	if r := findCondition(node.Status.Conditions, corev1.NodeReady); !r.LastTransitionTime.Equal(&ready0.LastTransitionTime) {
		t.Errorf("Ready lastTransitionTime moved from %v to %v without a transition", ready0.LastTransitionTime, r.LastTransitionTime)
	}

	// Someone else's condition is kept.
	custom := corev1.NodeCondition{Type: "example.com/Custom", Status: corev1.ConditionTrue, Reason: "Test",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	node.Status.Conditions = append(node.Status.Conditions, custom)
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("add a condition: %v", err)
	}

	// The pod network goes down.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond))) // a new second for the transition
	flipped := time.Now()
	a.rt.set(true, false, "NetworkPluginNotReady: cni config uninitialized")
	poll.Until(t, 2*time.Second, "Ready False", func() error {
		node = getNode(t, c, name)
		if r := findCondition(node.Status.Conditions, corev1.NodeReady); r.Status != corev1.ConditionFalse {
			return errors.New("Ready is " + string(r.Status))
		}
		return nil
	})
	t.Logf("Ready False %v after the runtime said so", time.Since(flipped).Round(time.Millisecond))
	want[corev1.NodeReady], want[corev1.NodeNetworkUnavailable], want["example.com/Custom"] =
		corev1.ConditionFalse, corev1.ConditionTrue, corev1.ConditionTrue
	if diff := cmp.Diff(want, statuses(node)); diff != "" {
		t.Errorf("conditions with the network down mismatch (-want +got):\n%s", diff)
	}
	r := findCondition(node.Status.Conditions, corev1.NodeReady)
	if r.Reason != "NetworkNotReady" || r.Message != "container runtime network not ready: NetworkPluginNotReady: cni config uninitialized" {
		t.Errorf("Ready reason %q, message %q; want NetworkNotReady and the runtime's reason", r.Reason, r.Message)
	}
	if !r.LastTransitionTime.After(ready0.LastTransitionTime.Time) {
		t.Errorf("Ready lastTransitionTime = %v, want after %v", r.LastTransitionTime, ready0.LastTransitionTime)
	}
	if m := findCondition(node.Status.Conditions, corev1.NodeMemoryPressure); !m.LastTransitionTime.Equal(&mem0.LastTransitionTime) {
		t.Errorf("MemoryPressure lastTransitionTime moved from %v to %v", mem0.LastTransitionTime, m.LastTransitionTime)
	}

	// The runtime itself goes down, then everything comes back.
	a.rt.set(false, false, "containerd is restarting")
	poll.Until(t, 2*time.Second, "Ready for RuntimeNotReady", func() error {
		r := findCondition(getNode(t, c, name).Status.Conditions, corev1.NodeReady)
		if r.Reason != "RuntimeNotReady" {
			return errors.New("Ready reason is " + r.Reason)
		}
		return nil
	})
	a.rt.set(true, true, "")
	poll.Until(t, 2*time.Second, "Ready True", func() error {
		if r := findCondition(getNode(t, c, name).Status.Conditions, corev1.NodeReady); r.Status != corev1.ConditionTrue {
			return errors.New("Ready is " + string(r.Status))
		}
		return nil
	})
}

// testQuiet checks that the node writes its status only when it changed:
// once the control plane is done with the new Node, it stays as it is.
func testQuiet(t *testing.T, c *kube.Cluster) {
	const name = "quiet-1"
	cfg := testConfig(t, c, name, t.TempDir())
	cfg.StatusInterval = 50 * time.Millisecond
	a := start(t, cfg)
	var node *corev1.Node
	poll.Until(t, 15*time.Second, "the control plane done with the Node", func() error {
		node = getNode(t, c, name)
		if len(node.Spec.Taints) > 0 || node.Labels["beta.kubernetes.io/os"] == "" {
			return errors.New("not-ready taint or no beta labels yet")
		}
		return nil
	})
	waitCount(t, &a.j.statusChecks, 20, "status measurements")
	if after := getNode(t, c, name); after.ResourceVersion != node.ResourceVersion {
		t.Errorf("Node changed from resourceVersion %s to %s in 20 status measurements without a change; status now %+v",
			node.ResourceVersion, after.ResourceVersion, after.Status.Conditions)
	}
}

// waitCount waits until the loop that counts in c ran n more times, which
// proves it had its chances to do what it should not.
func waitCount(t *testing.T, c *atomic.Uint64, n uint64, what string) {
	t.Helper()
	before := c.Load()
	poll.Until(t, 30*time.Second, fmt.Sprintf("%d more %s", n, what), func() error {
		if got := c.Load() - before; got < n {
			return fmt.Errorf("%d so far", got)
		}
		return nil
	})
}

func statuses(node *corev1.Node) map[corev1.NodeConditionType]corev1.ConditionStatus {
	m := map[corev1.NodeConditionType]corev1.ConditionStatus{}
	for _, c := range node.Status.Conditions {
		m[c.Type] = c.Status
	}
	return m
}

func testLease(t *testing.T, c *kube.Cluster) {
	const name = "lease-1"
	start(t, testConfig(t, c, name, t.TempDir()))
	node := getNode(t, c, name)
	waitRenewedAfter(t, c, name, time.Now(), 5*time.Second)
	l, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h, d := l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds; h == nil || *h != name || d == nil || *d != 40 {
		t.Errorf("Lease holder %v, duration %v; want %s, 40", h, d, name)
	}
	wantOwner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: node.UID}}
	if diff := cmp.Diff(wantOwner, l.OwnerReferences); diff != "" {
		t.Errorf("Lease owner mismatch (-want +got):\n%s", diff)
	}
	// Renewals keep coming.
	first := l.Spec.RenewTime.Time
	waitRenewedAfter(t, c, name, first, 2*time.Second)

	c.RestartAPIServer()
	restarted := time.Now()
	waitRenewedAfter(t, c, name, restarted, 10*time.Second)
	t.Logf("Lease renewed %v after the API server was back", time.Since(restarted).Round(time.Millisecond))
	// And so do the status updates: what the node measures comes back.
	if _, err := c.Client.CoreV1().Nodes().PatchStatus(context.Background(), name,
		[]byte(`{"status":{"capacity":{"pods":"1"}}}`)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "status patched after the restart", func() error {
		n := getNode(t, c, name)
		if n.Status.Capacity.Pods().Cmp(resource.MustParse("110")) != 0 {
			return errors.New("capacity pods not reported again")
		}
		return nil
	})
}

// TestRunUnreachable runs against an API server that is not there: Run
// keeps retrying without giving up, and returns nil soon after its context
// ends.
func TestRunUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	ca, err := machineconfig.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	started := time.Now()
	rt := &fakeRuntime{runtimeReady: true, networkReady: true}
	err = Run(ctx, Config{
		NodeName: "far-1",
		Cluster:  machineconfig.Cluster{Server: "https://" + addr, CA: string(ca.CertPEM), BootstrapToken: "abcdef.0123456789abcdef"},
		Dir:      t.TempDir(), RuntimeInfo: rt, RuntimeStatus: rt,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}, nil)
	if err != nil {
		t.Errorf("Run() = %v, want nil after its context ended", err)
	}
	if d := time.Since(started); d > 2500*time.Millisecond {
		t.Errorf("Run() returned %v after start, want soon after its context ended at 1.5 s", d)
	}
}

func TestRunBadConfig(t *testing.T) {
	err := Run(context.Background(), Config{}, nil)
	if got, want := errString(err), "node config: no node name\nno state directory\nno runtime info or status"; got != want {
		t.Errorf("Run(Config{}, nil) = %q, want %q", got, want)
	}
}
