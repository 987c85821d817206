// Package cluster runs a Kubernetes cluster of Cairn nodes in QEMU on this
// machine: a control plane (internal/controlplane) and N nodes booted from
// one generic image, each with its own machine config on a NoCloud volume
// and a copy-on-write overlay of the image.
//
// The nodes share an L2 network: a bridge in a network namespace that the
// cluster makes and that the control plane listens in, with a tap per VM
// handed to QEMU as a file descriptor. Nothing routes out of that
// namespace. Each VM also has user networking, for its API port forwarded
// to the host's loopback (and for pulls from registries the host serves).
// The API server is forwarded to the host's loopback too, for the
// kubeconfig the cluster writes.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/image/build"
	"github.com/cairn-os/cairn/internal/controlplane"
	"github.com/cairn-os/cairn/internal/inns"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
)

// Defaults of Options.
const (
	DefaultName        = "cairn"
	DefaultNetwork     = "10.89.0.0/24"
	DefaultPodCIDR     = "10.244.0.0/16"
	DefaultServiceCIDR = "10.96.0.0/16"
	// APIServerPort is kube-apiserver's port on the bridge.
	APIServerPort = 6443
)

// Options describe a cluster.
type Options struct {
	Name  string // default DefaultName; names the network namespace cairn-NAME
	Dir   string // where its files go; made if missing
	Nodes int    // how many; at least 1
	// ControlPlaneBin is the directory of etcd, kube-apiserver,
	// kube-controller-manager and kube-scheduler (make cluster), and of
	// coredns (make coredns).
	ControlPlaneBin string
	// Kubeconfig, if set, is an existing cluster's, with a user that may
	// create bootstrap tokens, RBAC bindings and Deployments: the nodes
	// join it, and no control plane is started (see external).
	Kubeconfig string
	// PodCIDR is the cluster's pod network (DefaultPodCIDR): the control
	// plane gives each Node a range of it; an existing cluster's must be
	// given as its kube-controller-manager has it.
	PodCIDR netip.Prefix
	// Assets is the directory of the node binaries (make build).
	Assets   string
	CacheDir string // of image builds; default rootfs.DefaultCacheDir()
	// Network is the nodes' L2 network: the control plane takes its first
	// address, node i (from 1) the (10+i)th.
	Network netip.Prefix
	// NodePort, if not 0, is a NodePort forwarded from the host's
	// loopback to each node's InternalIP, through the cluster's network:
	// see State.Nodes' Forwarded.
	NodePort  int
	MemoryMiB int
	CPUs      int
	Accel     string
	// Timeout bounds the wait for every node to be Ready.
	Timeout time.Duration
	// Progress gets a line for each step.
	Progress func(string)
}

// ValidateName checks a cluster's name: it names a network namespace and
// a directory, so it is a DNS label of at most 32 characters.
func ValidateName(name string) error {
	if len(name) > 32 || !nameRE.MatchString(name) {
		return fmt.Errorf("cluster name %q: want at most 32 lower-case letters, digits and dashes, not at either end", name)
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

func (o *Options) setDefaults() {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if !o.Network.IsValid() {
		o.Network = netip.MustParsePrefix(DefaultNetwork)
	}
	if !o.PodCIDR.IsValid() {
		o.PodCIDR = netip.MustParsePrefix(DefaultPodCIDR)
	}
	if o.Timeout == 0 {
		o.Timeout = 20 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
}

// Cluster is a running cluster, owned by this process.
type Cluster struct {
	opts  Options
	state State
	net   *network
	cp    *controlplane.ControlPlane // nil with Options.Kubeconfig
	api   *apiServer
	// forwards listen on the host's loopback (forward).
	forwards []net.Listener
	// registry is the cluster's image registry (serveRegistry).
	registry *http.Server
	nodes    []*node
}

// apiServer is the cluster's API server as this process and the nodes
// use it.
type apiServer struct {
	client  kubernetes.Interface
	server  string // HOST:PORT where this process reaches it
	nodeURL string // where the nodes reach it
	caPEM   []byte
	token   string // the nodes' bootstrap token
	// external: an existing cluster's (Options.Kubeconfig), which
	// outlives this one.
	external bool
}

// node is one VM and its API client.
type node struct {
	name   string
	vm     *qemu.VM
	client *client.Client
}

// Create makes and starts the cluster and returns once every node is
// Ready, or at ctx's end or Options.Timeout. A node that does not come up
// is named with its console's last lines; the others go on, and Create
// returns the cluster with an error. Any other error leaves nothing
// running. The state is written to Dir/state.json at each step.
func Create(ctx context.Context, opts Options) (*Cluster, error) {
	opts.setDefaults()
	if err := ValidateName(opts.Name); err != nil {
		return nil, err
	}
	if opts.Nodes < 1 {
		return nil, errors.New("a cluster needs at least one node")
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	if opts.Kubeconfig != "" {
		if opts.Kubeconfig, err = filepath.Abs(opts.Kubeconfig); err != nil {
			return nil, err
		}
	}
	c := &Cluster{opts: opts, state: State{
		Name: opts.Name, PID: os.Getpid(), Phase: PhaseStarting, Netns: "cairn-" + opts.Name,
		Kubeconfig:   filepath.Join(dir, "kubeconfig"),
		ClientConfig: filepath.Join(dir, machineconfig.ClientConfigFile),
	}}
	if err := c.writeState(); err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		derr := c.Destroy()
		c.state.Phase, c.state.Error = PhaseFailed, err.Error()
		return nil, errors.Join(err, derr, c.writeState())
	}
	err = c.waitReady(ctx)
	if err != nil {
		c.state.Phase, c.state.Error = PhaseDegraded, err.Error()
	} else {
		c.state.Phase = PhaseReady
	}
	return c, errors.Join(err, c.writeState())
}

// start makes the network, the control plane, the images, and boots the
// nodes.
func (c *Cluster) start(ctx context.Context) error {
	o, step := c.opts, c.opts.Progress
	step(fmt.Sprintf("network namespace %s: bridge %s on %s", c.state.Netns, bridge, o.Network))
	var err error
	if c.net, err = newNetwork(c.state.Netns, o.Network, o.Nodes); err != nil {
		return err
	}

	if o.Kubeconfig != "" {
		step("control plane: the existing cluster of " + o.Kubeconfig)
		if c.api, err = external(o.Kubeconfig); err != nil {
			return err
		}
		c.state.Kubeconfig, c.state.APIServer = o.Kubeconfig, c.api.server
		step("the nodes join " + c.api.nodeURL)
	} else if err := c.startControlPlane(); err != nil {
		return err
	}
	if err := c.serveRegistry(); err != nil {
		return err
	}
	step(fmt.Sprintf("registry: push to %s, the nodes pull from %s", c.state.Registry, c.state.NodeRegistry))
	if err := c.deployDNS(ctx); err != nil {
		return err
	}
	if c.state.DeployedDNS {
		step("CoreDNS deployed as the cluster's DNS at " + c.state.DNS)
	}

	bundles, err := c.nodeConfigs()
	if err != nil {
		return err
	}
	disks, err := c.disks(ctx, bundles)
	if err != nil {
		return err
	}
	return c.boot(bundles, disks)
}

// startControlPlane starts the cluster's own control plane in its network
// namespace and forwards its API server to the host's loopback.
func (c *Cluster) startControlPlane() error {
	o, step := c.opts, c.opts.Progress
	step("control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler")
	start := time.Now()
	cpDir := filepath.Join(o.Dir, "controlplane")
	if err := os.RemoveAll(cpDir); err != nil {
		return err
	}
	var err error
	if c.cp, err = controlplane.Run(o.ControlPlaneBin, cpDir, controlplane.Options{
		Address: c.net.host(), Port: APIServerPort, Netns: c.state.Netns, Scheduler: true,
		PodCIDR: o.PodCIDR.String(), ServiceCIDR: DefaultServiceCIDR,
		// The nodes' hostnames resolve nowhere: reach their kubelet
		// servers (logs, exec) at their InternalIPs.
		APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP,Hostname"},
	}); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	step(fmt.Sprintf("control plane at %s usable after %s", c.cp.URL, time.Since(start).Round(time.Second)))
	if err := c.forwardAPIServer(); err != nil {
		return err
	}
	c.api = &apiServer{client: c.cp.Client, server: c.state.APIServer, nodeURL: c.cp.URL, caPEM: c.cp.CAPEM, token: c.cp.BootstrapToken}
	return nil
}

// forwardAPIServer serves the API server on a free port of the host's
// loopback and writes the kubeconfig that goes there.
func (c *Cluster) forwardAPIServer() error {
	var err error
	if c.state.APIServer, err = c.forward(net.JoinHostPort(c.net.host().String(), strconv.Itoa(APIServerPort))); err != nil {
		return err
	}
	cert, key, err := c.cp.IssueClient("cairn-admin", "system:masters")
	if err != nil {
		return err
	}
	return c.cp.WriteKubeconfig(c.state.Kubeconfig, "https://"+c.state.APIServer,
		&clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key})
}

// nodeConfigs generates a machine config per node, all with one API CA,
// and the client config for all of them.
func (c *Cluster) nodeConfigs() ([]*machineconfig.Bundle, error) {
	o := c.opts
	var bundles []*machineconfig.Bundle
	var ca *machineconfig.CA
	var endpoints []string
	serviceCIDRs, err := c.api.serviceCIDRs()
	if err != nil {
		return nil, err
	}
	for i := range o.Nodes {
		name := fmt.Sprintf("node-%d", i+1)
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		endpoint := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		b, err := machineconfig.Generate(machineconfig.GenerateOptions{
			Hostname: name, Interface: "eth0", Endpoints: []string{endpoint}, CA: ca,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		ca = b.CA
		addr := c.net.nodeAddr(i)
		cfg := b.Config
		cfg.Network.Interfaces = append(cfg.Network.Interfaces, machineconfig.Interface{
			MAC: nodeMAC(i).String(), Addresses: []string{netip.PrefixFrom(addr, o.Network.Bits()).String()},
		})
		cfg.Cluster = &machineconfig.Cluster{
			Server:         c.api.nodeURL,
			CA:             string(c.api.caPEM),
			BootstrapToken: c.api.token,
			NodeIP:         addr.String(),
			ClusterCIDRs:   []string{o.PodCIDR.String()},
			ServiceCIDRs:   serviceCIDRs,
			ClusterDNS:     []string{c.state.DNS},
		}
		cfg.Containerd.Registries = []machineconfig.Registry{{Host: c.state.NodeRegistry, Endpoints: []string{"http://" + c.state.NodeRegistry}}}
		// Checked as the node will read it: defaults applied, then validated.
		data, err := cfg.Marshal()
		if err == nil {
			_, err = machineconfig.Parse(data)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		n := NodeState{Name: name, Address: addr.String(), API: endpoint, Dir: filepath.Join(o.Dir, name)}
		if o.NodePort != 0 {
			if n.Forwarded, err = c.forward(net.JoinHostPort(n.Address, strconv.Itoa(o.NodePort))); err != nil {
				return nil, err
			}
		}
		c.state.Nodes = append(c.state.Nodes, n)
		endpoints = append(endpoints, endpoint)
		bundles = append(bundles, b)
	}
	client := *bundles[0].Client
	client.Endpoints = endpoints
	if err := client.Write(c.state.ClientConfig); err != nil {
		return nil, err
	}
	return bundles, c.writeState()
}

// disks builds the generic image once, and for each node a qcow2 overlay
// of it and a NoCloud volume with its config: every node shares
// everything but its STATE.
func (c *Cluster) disks(ctx context.Context, bundles []*machineconfig.Bundle) ([]string, error) {
	o := c.opts
	base := filepath.Join(o.Dir, "generic.raw")
	o.Progress("image: " + base)
	if _, err := build.Build(ctx, build.Options{
		Generic: true, Output: base, Assets: o.Assets, CacheDir: o.CacheDir,
		Progress: func(line string) { o.Progress("  " + line) },
	}); err != nil {
		return nil, fmt.Errorf("build the node image: %w", err)
	}
	var disks []string
	for i, b := range bundles {
		n := c.state.Nodes[i]
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return nil, err
		}
		config, err := b.Config.Marshal()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(n.Dir, machineconfig.MachineConfigFile), config, 0o600); err != nil {
			return nil, err
		}
		disk := filepath.Join(n.Dir, "disk.qcow2")
		for _, f := range []string{disk, disk + ".efivars"} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
		if out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, disk).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: qemu-img create: %v: %s", n.Name, err, out)
		}
		meta := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", n.Name, n.Name)
		if err := image.WriteNoCloud(ctx, image.NoCloud{UserData: config, MetaData: []byte(meta), SourceDateEpoch: build.DefaultSourceDateEpoch},
			filepath.Join(n.Dir, "cidata.img")); err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		disks = append(disks, disk)
	}
	return disks, nil
}

// boot starts every node's VM.
func (c *Cluster) boot(bundles []*machineconfig.Bundle, disks []string) error {
	o := c.opts
	for i, b := range bundles {
		n := &c.state.Nodes[i]
		port, _ := strconv.Atoi(n.API[len("127.0.0.1:"):])
		vo := qemu.Options{
			Disk: disks[i], Attach: []string{filepath.Join(n.Dir, "cidata.img")}, APIPort: port,
			Taps: []qemu.Tap{c.net.tap(i)}, MemoryMiB: o.MemoryMiB, CPUs: o.CPUs, Accel: o.Accel,
			Notify: func(line string) { o.Progress(n.Name + ": " + line) },
		}
		cc := *b.Client
		cl, err := client.Dial(&cc, n.API)
		if err != nil {
			return err
		}
		vm, err := qemu.Start(vo)
		if err != nil {
			cl.Close()
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		n.Console = vm.Opts.ConsoleLog
		c.nodes = append(c.nodes, &node{name: n.Name, vm: vm, client: cl})
		o.Progress(fmt.Sprintf("%s: booting (accel %s, address %s, API %s, console %s)", n.Name, vm.Accel(), n.Address, n.API, n.Console))
	}
	return c.writeState()
}

// waitReady waits for each node's API, then for its Node to be Ready; it
// reports each as it comes. A node that fails is named with why; the
// others are waited for still.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	start := time.Now()
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.waitNode(ctx, n, start)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := c.waitDNS(ctx); err != nil {
		return err
	}
	c.opts.Progress(fmt.Sprintf("CoreDNS ready %s after the first boot started", time.Since(start).Round(time.Second)))
	c.state.ReadyAfter = time.Since(start).Round(time.Second).String()
	c.opts.Progress(fmt.Sprintf("cluster ready: %d nodes Ready and the cluster DNS serving %s after the first boot started", len(c.nodes), c.state.ReadyAfter))
	return nil
}

func (c *Cluster) waitNode(ctx context.Context, n *node, start time.Time) error {
	var last time.Duration
	err := n.vm.WaitReady(ctx, n.name+"'s API", func(ctx context.Context) error {
		_, err := n.client.Version(ctx, &machine.VersionRequest{})
		return err
	}, func(elapsed time.Duration, line string) {
		if elapsed-last >= 15*time.Second {
			last = elapsed
			c.opts.Progress(fmt.Sprintf("%s: %3.0fs %s", n.name, elapsed.Seconds(), line))
		}
	})
	if err != nil {
		return fmt.Errorf("%s: %w", n.name, err)
	}
	c.opts.Progress(fmt.Sprintf("%s: API up after %s; joining", n.name, time.Since(start).Round(time.Second)))
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	why := "not registered yet"
	for {
		node, err := c.api.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err == nil {
			why = "no Ready condition yet"
			for _, cond := range node.Status.Conditions {
				if cond.Type != corev1.NodeReady {
					continue
				}
				if cond.Status == corev1.ConditionTrue {
					c.opts.Progress(fmt.Sprintf("%s: Ready after %s", n.name, time.Since(start).Round(time.Second)))
					return c.routePods(node)
				}
				why = cond.Reason + ": " + cond.Message
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: its Node is not Ready (%s)%s", n.name, why, n.vm.ConsoleTail(5))
		case <-n.vm.Done():
			return fmt.Errorf("%s: QEMU exited: %v%s", n.name, n.vm.Wait(), n.vm.ConsoleTail(5))
		case <-tick.C:
		}
	}
}

// routePods routes node's pod CIDRs in the cluster's network namespace
// through its InternalIP, as the nodes route them to each other: the
// control plane reaches pods (the API server's proxy to pods and
// Services, webhooks) as it would on a node.
func (c *Cluster) routePods(node *corev1.Node) error {
	var via string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			via = a.Address
			break
		}
	}
	for _, cidr := range node.Spec.PodCIDRs {
		if err := ip("-n", c.state.Netns, "route", "replace", cidr, "via", via); err != nil {
			return fmt.Errorf("%s: route its pods: %w", node.Name, err)
		}
	}
	return nil
}

// State is what the cluster's state file says of it.
func (c *Cluster) State() State { return c.state }

// Wait returns when ctx ends or every node's QEMU has exited.
func (c *Cluster) Wait(ctx context.Context) {
	for _, n := range c.nodes {
		select {
		case <-ctx.Done():
			return
		case <-n.vm.Done():
		}
	}
}

// Destroy shuts the nodes down (through their API, else by stopping
// QEMU), stops the control plane, removes the network namespace and marks
// the state file stopped.
func (c *Cluster) Destroy() error {
	c.opts.Progress("stopping the nodes")
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.shutdown()
		}()
	}
	wg.Wait()
	var errs []error
	for _, l := range c.forwards {
		l.Close()
	}
	if c.registry != nil {
		c.registry.Close()
	}
	if c.cp != nil {
		c.opts.Progress("stopping the control plane")
		errs = append(errs, c.cp.Stop())
	}
	if c.api != nil && c.api.external {
		c.opts.Progress("removing the nodes from the existing cluster")
		errs = append(errs, c.leave())
	}
	if c.net != nil {
		errs = append(errs, c.net.remove())
	}
	c.state.Phase = PhaseStopped
	errs = append(errs, c.writeState())
	return errors.Join(errs...)
}

// shutdown powers the node off through its API, and stops QEMU if that
// fails or takes over a minute.
func (n *node) shutdown() {
	defer n.client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := n.client.Shutdown(ctx, &machine.ShutdownRequest{})
	cancel()
	if err == nil {
		select {
		case <-n.vm.Done():
			return
		case <-time.After(time.Minute):
		}
	}
	n.vm.Kill()
}

// forward listens on a free port of the host's loopback and joins each
// connection to target in the cluster's network, until Destroy; it
// returns the address it listens on.
func (c *Cluster) forward(target string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	c.forwards = append(c.forwards, l)
	go forward(l, inns.Dialer(c.state.Netns), target)
	return l.Addr().String(), nil
}

// forward accepts connections on l and joins each to target, dialled
// with dial, until l is closed.
func forward(l net.Listener, dial func(ctx context.Context, network, addr string) (net.Conn, error), target string) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			up, err := dial(ctx, "tcp", target)
			cancel()
			if err != nil {
				slog.Warn("forward into the cluster's network", "target", target, "err", err)
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				io.Copy(up, conn)
				up.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			io.Copy(conn, up)
			conn.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}

// freePort returns a TCP port free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
