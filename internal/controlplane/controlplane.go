// Package controlplane runs a real Kubernetes control plane from the
// binaries that `make cluster` builds from the pins in test/cluster: etcd,
// kube-apiserver and kube-controller-manager (kube-scheduler on request).
// Certificates, keys, data and logs live in one directory. It serves the
// agent's tests (through test/kube) and `cairn qemu cluster`.
//
// The control plane is set up as kubeadm sets one up for joining nodes: a
// bootstrap token (a Secret in kube-system) that may create CSRs, kubelet
// client CSRs from bootstrap tokens and renewals from nodes approved
// automatically and signed with the cluster CA, and the kube-public
// cluster-info ConfigMap signed with the token.
package controlplane

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cairn-os/cairn/internal/inns"
)

// Options shape the control plane; the zero value is a working one on
// loopback.
type Options struct {
	// ServiceCIDR is the service IP range; default 10.96.0.0/16. Two
	// ranges separated by a comma, one IPv4 and one IPv6, make the cluster
	// dual-stack: the first is the primary family, the one the kubernetes
	// Service and single-stack Services without an IP family get.
	ServiceCIDR string
	// PodCIDR, if set, makes kube-controller-manager give each Node a pod
	// range from it (spec.podCIDR), as kube-proxy and CNI plugins expect.
	PodCIDR string
	// Scheduler also starts kube-scheduler; without it, pods bind only by
	// spec.nodeName.
	Scheduler bool
	// ServingIPs are more addresses for the API server's serving
	// certificate, by which clients elsewhere reach it: 10.0.2.2 for a
	// QEMU guest with user networking, whose packets to it arrive on the
	// host's loopback.
	ServingIPs []net.IP
	// Address, if valid, is the address kube-apiserver listens on and
	// advertises (the kubernetes Service's endpoint); default 127.0.0.1,
	// which no pod reaches.
	Address netip.Addr
	// Port is kube-apiserver's; default a free one.
	Port int
	// Netns, if set, is the named network namespace (ip netns add) that
	// every process runs in; the control plane's own clients dial into it.
	Netns string
	// APIServerFlags and ControllerManagerFlags are appended to the
	// defaults; for a flag given twice, the later wins.
	APIServerFlags, ControllerManagerFlags []string
}

// ControlPlane is a control plane, running or not. Its methods are not
// safe for concurrent use.
type ControlPlane struct {
	// URL is the API server's, https://ADDRESS:PORT; it stays the same
	// across a restart of the API server.
	URL string
	// CAPEM is the cluster CA certificate: it signed the API server's
	// serving certificate and signs every certificate that a CSR asks for.
	CAPEM []byte
	// AdminKubeconfig is the path of a kubeconfig for a system:masters user.
	AdminKubeconfig string
	// AdminConfig and Client are for the same user.
	AdminConfig *rest.Config
	Client      kubernetes.Interface
	// BootstrapToken is a bootstrap token, ID.SECRET, as a joining node gets
	// it: it authenticates as system:bootstrap:ID in the groups
	// system:bootstrappers and system:bootstrappers:cairn:default-node-token,
	// may create CSRs, and its kubelet client CSRs are approved on their own.
	BootstrapToken string
	// BootstrapKubeconfig is the path of a kubeconfig with BootstrapToken.
	BootstrapKubeconfig string
	// Dir holds pki/, etcd/ and logs/.
	Dir string

	ca       *ca
	dial     func(ctx context.Context, network, addr string) (net.Conn, error) // nil: the default
	port     int                                                               // kube-apiserver's
	etcdPort int
	etcd     *process
	api      *process
	ctrl     *process
	sched    *process
	stopped  bool
}

// Names of what New creates besides the processes.
const (
	BootstrapGroup      = "system:bootstrappers:cairn:default-node-token"
	ClusterName         = "cairn"
	bindingBootstrapper = "cairn:kubelet-bootstrap"
	bindingAutoApprove  = "cairn:node-autoapprove-bootstrap"
	bindingAutoRenew    = "cairn:node-autoapprove-certificate-rotation"
	bindingNodeProxier  = "cairn:node-proxier"
	roleNodePolicy      = "cairn:node-network-policy"
)

// stopGrace is how long a process gets after SIGTERM before SIGKILL.
const stopGrace = 5 * time.Second

// Binaries are the names of the binaries in the directory given to New
// that opts needs.
func Binaries(opts Options) []string {
	names := []string{"etcd", "kube-apiserver", "kube-controller-manager"}
	if opts.Scheduler {
		names = append(names, "kube-scheduler")
	}
	return names
}

// Run starts a control plane from the binaries in bin, its files in dir,
// and returns when it is usable: the API server is ready, the bootstrap
// token authenticates and the default ServiceAccount exists, so that Pods
// can be created. On an error nothing is left running, and the error
// ends with the last lines of each process's log.
func Run(bin, dir string, opts Options) (*ControlPlane, error) {
	c, err := New(bin, dir, opts)
	if err != nil {
		return nil, err
	}
	if err := c.Boot(); err != nil {
		return nil, errors.Join(fmt.Errorf("%w\n%s", err, c.Tails(40)), c.Stop())
	}
	return c, nil
}

// Boot starts the processes that New set up and waits until the control
// plane is usable (see Run). On an error, some may run: stop them with
// Stop.
func (c *ControlPlane) Boot() error {
	if err := c.etcd.start(); err != nil {
		return err
	}
	if err := c.waitEtcd(c.etcdPort, 30*time.Second); err != nil {
		return err
	}
	if err := c.StartAPIServer(); err != nil {
		return err
	}
	if err := PrepareForNodes(c.Client, c.BootstrapToken, c.URL, c.CAPEM); err != nil {
		return err
	}
	for _, p := range c.processes()[2:] {
		if err := p.start(); err != nil {
			return err
		}
	}
	return c.waitUsable(60 * time.Second)
}

// StartAPIServer starts kube-apiserver, on the same port as before if it
// ran before, and waits until /readyz answers ok.
func (c *ControlPlane) StartAPIServer() error {
	if err := c.api.start(); err != nil {
		return err
	}
	return c.waitReady(90 * time.Second)
}

// StopAPIServer stops kube-apiserver and waits until it has exited; the
// rest keeps running. It stops gracefully on SIGTERM (clients see their
// watches end) in about a second, else by SIGKILL after 5 s, and then
// says so with killed.
func (c *ControlPlane) StopAPIServer() (killed bool, err error) {
	err = c.api.stop(stopGrace)
	return c.api.killed, err
}

// Stop stops every process and waits until each has exited; calling it
// again does nothing.
func (c *ControlPlane) Stop() error {
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	ps := c.processes()
	for i := len(ps) - 1; i >= 0; i-- { // dependents first, etcd last
		errs = append(errs, ps[i].stop(stopGrace))
	}
	return errors.Join(errs...)
}

// Process is one of the control plane's processes.
type Process struct {
	Name string
	PID  int // of its last start, 0 if never started
	// Exited, if not nil, says how it ended.
	Exited error
}

// Processes returns the processes in start order.
func (c *ControlPlane) Processes() []Process {
	var ps []Process
	for _, p := range c.processes() {
		ps = append(ps, Process{Name: p.name, PID: p.pid(), Exited: p.exited()})
	}
	return ps
}

// Ports are kube-apiserver's and etcd's client port.
func (c *ControlPlane) Ports() (apiserver, etcd int) { return c.port, c.etcdPort }

// Tails returns the last n lines of each process's log.
func (c *ControlPlane) Tails(n int) string {
	var b strings.Builder
	for _, p := range c.processes() {
		fmt.Fprintf(&b, "last lines of %s:\n%s\n", p.log, p.tail(n))
	}
	return b.String()
}

// IssueClient returns a client certificate and key from the cluster CA
// for user in groups: user system:node:NAME in group system:nodes is a
// node as the Node authorizer knows it.
func (c *ControlPlane) IssueClient(user string, groups ...string) (certPEM, keyPEM []byte, err error) {
	return c.ca.issue(certSpec{commonName: user, organizations: groups, usage: x509.ExtKeyUsageClientAuth})
}

// UserConfig returns a client configuration for a user authenticated by a
// client certificate from the cluster CA (see IssueClient).
func (c *ControlPlane) UserConfig(user string, groups ...string) (*rest.Config, error) {
	certPEM, keyPEM, err := c.IssueClient(user, groups...)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host: c.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: c.CAPEM, CertData: certPEM, KeyData: keyPEM,
		},
		Dial: c.dial,
	}, nil
}

// New writes the certificates and kubeconfigs into dir and sets up the
// processes from the binaries in bin, starting none of them.
func New(bin, dir string, opts Options) (*ControlPlane, error) {
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "10.96.0.0/16"
	}
	if !opts.Address.IsValid() {
		opts.Address = netip.MustParseAddr("127.0.0.1")
	}
	c := &ControlPlane{Dir: dir}
	if opts.Netns != "" {
		c.dial = inns.Dialer(opts.Netns)
	}
	pki := filepath.Join(dir, "pki")
	for _, d := range []string{pki, filepath.Join(dir, "etcd"), filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}

	servingIPs := opts.ServingIPs
	if !opts.Address.IsLoopback() {
		servingIPs = append(servingIPs, opts.Address.AsSlice())
	}
	files, err := c.writePKI(pki, opts.ServiceCIDR, servingIPs)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	c.etcdPort, c.port = ports[0], ports[2]
	if opts.Port != 0 {
		c.port = opts.Port
	}
	etcdPort, peerPort := ports[0], ports[1]
	c.URL = "https://" + net.JoinHostPort(opts.Address.String(), strconv.Itoa(c.port))
	if c.BootstrapToken, err = NewBootstrapToken(); err != nil {
		return nil, err
	}
	c.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	c.BootstrapKubeconfig = filepath.Join(dir, "bootstrap.kubeconfig")
	if err := c.WriteKubeconfig(c.AdminKubeconfig, "", &clientcmdapi.AuthInfo{
		ClientCertificate: files.adminCert, ClientKey: files.adminKey,
	}); err != nil {
		return nil, err
	}
	if err := c.WriteKubeconfig(c.BootstrapKubeconfig, "", &clientcmdapi.AuthInfo{Token: c.BootstrapToken}); err != nil {
		return nil, err
	}
	if c.AdminConfig, err = clientcmd.BuildConfigFromFlags("", c.AdminKubeconfig); err != nil {
		return nil, fmt.Errorf("%s: %w", c.AdminKubeconfig, err)
	}
	c.AdminConfig.QPS, c.AdminConfig.Burst = 100, 200
	c.AdminConfig.Dial = c.dial
	if c.Client, err = kubernetes.NewForConfig(c.AdminConfig); err != nil {
		return nil, err
	}

	logs := filepath.Join(dir, "logs")
	c.etcd = &process{
		name: "etcd",
		path: filepath.Join(bin, "etcd"),
		log:  filepath.Join(logs, "etcd.log"),
		args: []string{
			"--name=test",
			"--data-dir=" + filepath.Join(dir, "etcd"),
			"--listen-client-urls=" + httpURL(etcdPort),
			"--advertise-client-urls=" + httpURL(etcdPort),
			"--listen-peer-urls=" + httpURL(peerPort),
			"--initial-advertise-peer-urls=" + httpURL(peerPort),
			"--initial-cluster=test=" + httpURL(peerPort),
			"--unsafe-no-fsync", // the data dies with the test
			"--log-level=warn",
		},
	}
	apiArgs := []string{
		"--etcd-servers=" + httpURL(etcdPort),
		"--bind-address=" + opts.Address.String(),
		"--advertise-address=" + opts.Address.String(),
		"--secure-port=" + strconv.Itoa(c.port),
	}
	if opts.Address.IsLoopback() {
		// The endpoint reconciler refuses a loopback advertise address.
		apiArgs = append(apiArgs, "--endpoint-reconciler-type=none")
	}
	c.api = &process{
		name: "kube-apiserver",
		path: filepath.Join(bin, "kube-apiserver"),
		log:  filepath.Join(logs, "kube-apiserver.log"),
		args: append(append(apiArgs,
			"--tls-cert-file="+files.servingCert,
			"--tls-private-key-file="+files.servingKey,
			"--client-ca-file="+files.caCert,
			"--authorization-mode=Node,RBAC",
			"--enable-bootstrap-token-auth",
			"--enable-admission-plugins=NodeRestriction",
			"--allow-privileged",
			"--service-cluster-ip-range="+opts.ServiceCIDR,
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file="+files.saKey,
			"--service-account-signing-key-file="+files.saKey,
			"--kubelet-client-certificate="+files.kubeletClientCert,
			"--kubelet-client-key="+files.kubeletClientKey,
			"--profiling=false",
			// On SIGTERM, end watches after 1 s rather than wait for
			// clients to close them: a graceful stop in seconds.
			"--shutdown-watch-termination-grace-period=1s",
		), opts.APIServerFlags...),
	}
	ctrlArgs := []string{
		"--kubeconfig=" + c.AdminKubeconfig,
		"--secure-port=0",
		"--leader-elect=false",
		"--controllers=*,bootstrapsigner,tokencleaner",
		"--cluster-name=" + ClusterName,
		"--service-account-private-key-file=" + files.saKey,
		"--root-ca-file=" + files.caCert,
		"--cluster-signing-cert-file=" + files.caCert,
		"--cluster-signing-key-file=" + files.caKey,
		"--service-cluster-ip-range=" + opts.ServiceCIDR,
		"--profiling=false",
	}
	if opts.PodCIDR != "" {
		ctrlArgs = append(ctrlArgs, "--allocate-node-cidrs", "--cluster-cidr="+opts.PodCIDR)
	}
	c.ctrl = &process{
		name: "kube-controller-manager",
		path: filepath.Join(bin, "kube-controller-manager"),
		log:  filepath.Join(logs, "kube-controller-manager.log"),
		args: append(ctrlArgs, opts.ControllerManagerFlags...),
	}
	if opts.Scheduler {
		c.sched = &process{
			name: "kube-scheduler",
			path: filepath.Join(bin, "kube-scheduler"),
			log:  filepath.Join(logs, "kube-scheduler.log"),
			args: []string{
				"--kubeconfig=" + c.AdminKubeconfig,
				"--secure-port=0",
				"--leader-elect=false",
				"--profiling=false",
			},
		}
	}
	for _, p := range c.processes() {
		p.netns = opts.Netns
	}
	return c, nil
}

func httpURL(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }

// pkiFiles are the paths that the processes read.
type pkiFiles struct {
	caCert, caKey                       string
	servingCert, servingKey             string
	adminCert, adminKey                 string
	kubeletClientCert, kubeletClientKey string
	saKey                               string
}

func (c *ControlPlane) writePKI(dir, serviceCIDR string, servingIPs []net.IP) (pkiFiles, error) {
	var f pkiFiles
	var err error
	if c.ca, err = newCA("cairn-ca"); err != nil {
		return f, err
	}
	c.CAPEM = c.ca.certPEM
	if f.caCert, f.caKey, err = writeKeyPair(dir, "ca", c.ca.certPEM, c.ca.keyPEM); err != nil {
		return f, err
	}
	primary, _, _ := strings.Cut(serviceCIDR, ",")
	_, svc, err := net.ParseCIDR(primary)
	if err != nil {
		return f, fmt.Errorf("service CIDR: %w", err)
	}
	kubernetesIP := append(net.IP(nil), svc.IP...) // the first address: the kubernetes Service
	kubernetesIP[len(kubernetesIP)-1]++
	for _, k := range []struct {
		name      string
		spec      certSpec
		cert, key *string
	}{
		{"apiserver", certSpec{
			commonName: "kube-apiserver",
			dnsNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc.cluster.local"},
			ips:   append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, kubernetesIP}, servingIPs...),
			usage: x509.ExtKeyUsageServerAuth,
		}, &f.servingCert, &f.servingKey},
		{"admin", certSpec{commonName: "cairn-admin", organizations: []string{"system:masters"}, usage: x509.ExtKeyUsageClientAuth},
			&f.adminCert, &f.adminKey},
		{"apiserver-kubelet-client", certSpec{commonName: "kube-apiserver-kubelet-client",
			organizations: []string{"system:masters"}, usage: x509.ExtKeyUsageClientAuth},
			&f.kubeletClientCert, &f.kubeletClientKey},
	} {
		certPEM, keyPEM, err := c.ca.issue(k.spec)
		if err != nil {
			return f, err
		}
		if *k.cert, *k.key, err = writeKeyPair(dir, k.name, certPEM, keyPEM); err != nil {
			return f, err
		}
	}
	saKey, err := newKey()
	if err != nil {
		return f, err
	}
	saPEM, err := keyPEM(saKey)
	if err != nil {
		return f, err
	}
	f.saKey = filepath.Join(dir, "sa.key")
	return f, os.WriteFile(f.saKey, saPEM, 0o600)
}

// WriteKubeconfig writes a kubeconfig for user that reaches the API
// server at server (https://HOST:PORT, one of the serving certificate's
// addresses), or at URL if server is "".
func (c *ControlPlane) WriteKubeconfig(path, server string, user *clientcmdapi.AuthInfo) error {
	if server == "" {
		server = c.URL
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[ClusterName] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.CAPEM}
	cfg.AuthInfos["user"] = user
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: ClusterName, AuthInfo: "user"}
	cfg.CurrentContext = "default"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// BootstrapConfig returns a client configuration that authenticates with
// BootstrapToken.
func (c *ControlPlane) BootstrapConfig() *rest.Config {
	return &rest.Config{
		Host:            c.URL,
		BearerToken:     c.BootstrapToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM},
		Dial:            c.dial,
	}
}

// processes returns the processes in start order.
func (c *ControlPlane) processes() []*process {
	ps := []*process{c.etcd, c.api, c.ctrl}
	if c.sched != nil {
		ps = append(ps, c.sched)
	}
	return ps
}

// poll calls f every 100 ms until it returns true or an error, or the
// timeout passes; then it returns an error that names what and f's last
// error.
func poll(what string, timeout time.Duration, f func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ok, err := f(ctx)
		cancel()
		if ok {
			return nil
		}
		var stop stopError
		if errors.As(err, &stop) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not done after %v (last error: %v)", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopError ends a poll at once.
type stopError struct{ error }

func (c *ControlPlane) waitEtcd(port int, timeout time.Duration) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: c.dial}}
	defer hc.CloseIdleConnections()
	return poll("wait for etcd", timeout, func(ctx context.Context) (bool, error) {
		if err := c.etcd.exited(); err != nil {
			return false, stopError{err}
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", httpURL(port)+"/health", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("/health: %s", resp.Status)
	})
}

func (c *ControlPlane) waitReady(timeout time.Duration) error {
	hc, err := rest.HTTPClientFor(c.AdminConfig)
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	return poll("wait for kube-apiserver /readyz", timeout, func(ctx context.Context) (bool, error) {
		if err := c.api.exited(); err != nil {
			return false, stopError{err}
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", c.URL+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("/readyz: %s", resp.Status)
	})
}

// waitUsable waits until the bootstrap token authenticates and the default
// ServiceAccount exists (kube-controller-manager runs).
func (c *ControlPlane) waitUsable(timeout time.Duration) error {
	boot, err := kubernetes.NewForConfig(c.BootstrapConfig())
	if err != nil {
		return err
	}
	want := "system:bootstrap:" + strings.Split(c.BootstrapToken, ".")[0]
	err = poll("wait for the bootstrap token to authenticate", timeout, func(ctx context.Context) (bool, error) {
		r, err := boot.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return r.Status.UserInfo.Username == want, fmt.Errorf("authenticated as %q", r.Status.UserInfo.Username)
	})
	if err != nil {
		return err
	}
	return poll("wait for the default ServiceAccount", timeout, func(ctx context.Context) (bool, error) {
		for _, p := range c.processes()[2:] {
			if err := p.exited(); err != nil {
				return false, stopError{err}
			}
		}
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
}
