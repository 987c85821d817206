package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cairn-os/cairn/qemu"
	"github.com/cairn-os/cairn/qemu/cluster"
)

// clusterDir is the default directory of the cluster named name.
func clusterDir(name string) string { return filepath.Join("_out", "clusters", name) }

func qemuClusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run a Kubernetes cluster of Cairn nodes in QEMU on this machine",
		Long: `A control plane and N Cairn nodes in QEMU, on one L2 network inside a
network namespace that nothing routes out of. The nodes boot one generic
image (a copy-on-write overlay each) with their own machine config on a
NoCloud volume. The API server and each node's API are forwarded to the
host's loopback; create writes a kubeconfig and a client config for
cairn node.`,
	}
	var name, dir string
	dirOf := func() string {
		if dir != "" {
			return dir
		}
		return clusterDir(name)
	}
	cmd.PersistentFlags().StringVar(&name, "name", cluster.DefaultName, "cluster name: its network namespace is cairn-NAME")
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "the cluster's directory (default _out/clusters/NAME)")
	// The name makes a directory that destroy removes: checked first.
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error { return cluster.ValidateName(name) }

	var o cluster.Options
	var network, podCIDR string
	var foreground bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Start the control plane, build the image, boot the nodes and wait until they are Ready",
		Long: `Create runs the cluster in a process of its own that stays when create
returns; it shows that process's progress until every node is Ready. With
--foreground it is that process: Ctrl-C then destroys the cluster.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Name, o.Dir = name, dirOf()
			if s, err := cluster.ReadState(o.Dir); err == nil && s.Running() {
				return fmt.Errorf("cluster %s already runs (process %d): cairn qemu cluster destroy --name %s", s.Name, s.PID, s.Name)
			}
			p, err := netip.ParsePrefix(network)
			if err != nil {
				return fmt.Errorf("--network: %w", err)
			}
			o.Network = p
			if o.PodCIDR, err = netip.ParsePrefix(podCIDR); err != nil {
				return fmt.Errorf("--pod-cidr: %w", err)
			}
			if o.Assets == "" {
				o.Assets = defaultAssets()
			}
			if o.ControlPlaneBin == "" {
				o.ControlPlaneBin = filepath.Join(filepath.Dir(o.Assets), "cluster", "bin")
			}
			if !foreground {
				return createDetached(cmd.Context(), cmd.OutOrStdout(), o.Dir)
			}
			return runCluster(cmd.Context(), o)
		},
	}
	f := create.Flags()
	f.IntVar(&o.Nodes, "nodes", 2, "how many nodes")
	f.StringVar(&network, "network", cluster.DefaultNetwork, "the nodes' network: the control plane takes its first address, node-N the (10+N)th")
	f.StringVar(&podCIDR, "pod-cidr", cluster.DefaultPodCIDR, "the cluster's pod network; with --kubeconfig, the one its kube-controller-manager gives ranges of")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "join the nodes to this existing cluster instead of starting a control plane (its server on the host's loopback must have "+qemu.HostAddress+" in its certificate)")
	f.IntVar(&o.NodePort, "node-port", 0, "a NodePort to forward from the host's loopback to each node (status shows where)")
	f.IntVar(&o.MemoryMiB, "memory", 2048, "memory of each node in MiB")
	f.IntVar(&o.CPUs, "cpus", 2, "virtual CPUs of each node")
	f.StringVar(&o.Accel, "accel", qemu.DefaultAccel(), "accelerator: auto, kvm or tcg")
	f.StringVar(&o.Assets, "assets", "", "directory of the node binaries (default: beside this program)")
	f.StringVar(&o.ControlPlaneBin, "control-plane-bin", "", "directory of etcd, kube-apiserver, kube-controller-manager and kube-scheduler (default: ../cluster/bin beside the assets, where make cluster puts them)")
	f.StringVar(&o.CacheDir, "cache", "", "cache of image builds (default $CAIRN_CACHE or ~/.cache/cairn)")
	f.DurationVar(&o.Timeout, "timeout", 20*time.Minute, "how long to wait for every node to be Ready")
	f.BoolVar(&foreground, "foreground", false, "run the cluster in this process until Ctrl-C or destroy")

	status := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes: their addresses, API endpoints and Ready condition",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return clusterStatus(cmd.Context(), cmd.OutOrStdout(), dirOf())
		},
	}
	var timeout time.Duration
	destroy := &cobra.Command{
		Use:   "destroy",
		Short: "Shut the nodes down, stop the control plane, and remove the network namespace and the cluster's directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cluster.Destroy(dirOf(), timeout); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster in %s destroyed\n", dirOf())
			return nil
		},
	}
	destroy.Flags().DurationVar(&timeout, "timeout", 3*time.Minute, "how long the nodes get to shut down")
	push := &cobra.Command{
		Use:   "push BINARY REPO:TAG",
		Short: "Push a static Linux binary as a one-layer image to the cluster's registry, for pods to run",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := cluster.ReadState(dirOf())
			if err != nil {
				return err
			}
			if !s.Running() {
				return fmt.Errorf("cluster %s does not run: cairn qemu cluster create --name %s", s.Name, s.Name)
			}
			if err := cluster.PushBinary(cmd.Context(), s.Registry, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s: pods name it %s/%s\n", args[0], s.NodeRegistry, args[1])
			return nil
		},
	}
	cmd.AddCommand(create, status, push, destroy)
	return cmd
}

// runCluster creates the cluster in this process and keeps it until a
// signal, then destroys it.
func runCluster(ctx context.Context, o cluster.Options) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	o.Progress = func(line string) { fmt.Printf("%s %s\n", time.Now().Format("15:04:05"), line) }
	c, err := cluster.Create(ctx, o)
	if c == nil {
		return err
	}
	if err != nil {
		fmt.Printf("cluster degraded: %v\n", err)
	}
	s := c.State()
	fmt.Printf("kubeconfig: %s\n  kubectl --kubeconfig %s get nodes -o wide\nnode API: cairn node --cairnconfig %s --nodes %s version\n",
		s.Kubeconfig, s.Kubeconfig, s.ClientConfig, s.Nodes[0].API)
	c.Wait(ctx)
	return c.Destroy()
}

// createDetached starts `create --foreground` with the same arguments in a
// session of its own, its output in DIR/cluster.log, and relays that log
// until the cluster is ready or has failed. Ctrl-C here destroys it.
func createDetached(ctx context.Context, out io.Writer, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "cluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	os.Remove(filepath.Join(dir, cluster.StateFile))
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(exe, append(os.Args[1:], "--foreground")...)
	child.Stdout, child.Stderr = logFile, logFile
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	fmt.Fprintf(out, "cluster process %d, log %s\n", child.Process.Pid, logPath)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	follow, err := os.Open(logPath)
	if err != nil {
		return err
	}
	defer follow.Close()
	r := bufio.NewReader(follow)
	relay := func() {
		for {
			line, err := r.ReadString('\n')
			if line != "" && err == nil {
				io.WriteString(out, line)
				continue
			}
			if line != "" { // a partial line: read it again once whole
				follow.Seek(-int64(len(line)), io.SeekCurrent)
				r.Reset(follow)
			}
			return
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		relay()
		select {
		case err := <-exited:
			relay()
			return fmt.Errorf("the cluster's process ended: %v (log: %s)", err, logPath)
		case <-sigs:
			fmt.Fprintln(out, "interrupted: destroying the cluster")
			child.Process.Signal(syscall.SIGTERM)
			<-exited
			relay()
			return errors.New("interrupted")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		s, err := cluster.ReadState(dir)
		if err != nil {
			continue
		}
		switch s.Phase {
		case cluster.PhaseFailed:
			<-exited
			relay()
			return fmt.Errorf("the cluster could not start: %s", s.Error)
		case cluster.PhaseReady, cluster.PhaseDegraded:
			time.Sleep(300 * time.Millisecond) // the last lines
			relay()
			fmt.Fprintf(out, "the cluster runs in process %d: cairn qemu cluster status|destroy --name %s\n", s.PID, s.Name)
			if s.Phase == cluster.PhaseDegraded {
				return fmt.Errorf("cluster degraded: %s", s.Error)
			}
			return nil
		}
	}
}

// clusterStatus prints the state of the cluster in dir and, while it
// runs, its Nodes as the API server has them.
func clusterStatus(ctx context.Context, out io.Writer, dir string) error {
	s, err := cluster.ReadState(dir)
	if err != nil {
		return err
	}
	running := "not running"
	if s.Running() {
		running = "process " + strconv.Itoa(s.PID)
	}
	fmt.Fprintf(out, "cluster %s: %s (%s)\n", s.Name, s.Phase, running)
	if s.Error != "" {
		fmt.Fprintf(out, "error: %s\n", s.Error)
	}
	fmt.Fprintf(out, "kubeconfig: %s (API server %s)\nclient config: %s\nregistry: push to %s; pods name the images %s/…\n",
		s.Kubeconfig, s.APIServer, s.ClientConfig, s.Registry, s.NodeRegistry)
	ready := map[string]string{}
	if s.Running() {
		ready, err = nodesReady(ctx, s.Kubeconfig)
		if err != nil {
			fmt.Fprintf(out, "API server: %v\n", err)
		}
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tADDRESS\tAPI\tNODEPORT\tREADY\tCONSOLE")
	for _, n := range s.Nodes {
		r := ready[n.Name]
		if r == "" {
			r = "-"
		}
		fwd := n.Forwarded
		if fwd == "" {
			fwd = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Address, n.API, fwd, r, n.Console)
	}
	return w.Flush()
}

// nodesReady returns each Node's Ready condition status.
func nodesReady(ctx context.Context, kubeconfig string) (map[string]string, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	ready := map[string]string{}
	for _, n := range nodes.Items {
		ready[n.Name] = "Unknown"
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready[n.Name] = string(c.Status)
			}
		}
	}
	return ready, nil
}
