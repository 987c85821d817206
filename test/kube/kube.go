// Package kube starts a real Kubernetes control plane on loopback for tests
// (internal/controlplane): etcd, kube-apiserver and kube-controller-manager
// (kube-scheduler on request), the binaries that make cluster builds from
// the pins in test/cluster. Certificates, keys, data and logs live in the
// test's temporary directory; every process is stopped and every file
// removed when the test ends.
//
//	c := kube.Start(t, kube.Options{})
//	c.Client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
//
// The tests of a package may instead share one cluster, started by the
// first that needs it and stopped after the last (Main, Shared), each in a
// namespace of its own (Namespace).
//
// The binaries are looked up in $CAIRN_CLUSTER_BIN, or else in
// _out/cluster/bin of the repository. Without them the test is skipped
// with "run make cluster", unless CAIRN_NO_SKIP is set (test/need): then it
// fails.
package kube

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cairn-os/cairn/internal/controlplane"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/repo"
)

// Options shape the cluster; the zero value is a working cluster.
type Options = controlplane.Options

// Cluster is a running control plane. Its methods must be called from the
// test's goroutine, like testing.TB's Fatal; for the shared cluster, from
// the goroutine of the test that Shared returned it to.
type Cluster struct {
	*controlplane.ControlPlane

	tb     testing.TB
	shared bool // a test's view of the shared cluster: see Shared
}

// Environment variables read by Start.
const (
	EnvBin = "CAIRN_CLUSTER_BIN" // directory of the binaries
)

// BootstrapGroup is the extra group of the bootstrap token.
const BootstrapGroup = controlplane.BootstrapGroup

// Start starts etcd, kube-apiserver and kube-controller-manager (and
// kube-scheduler if asked), and returns when the API server is ready, the
// bootstrap token authenticates and the default ServiceAccount exists, so
// that Pods can be created. Everything is stopped and removed in
// tb.Cleanup. Tests of a package may share one cluster instead: see Shared.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	started := time.Now()
	bin := binaries(tb, opts)
	cp, err := controlplane.New(bin, tb.TempDir(), opts)
	if err != nil {
		tb.Fatalf("kube: %v", err)
	}
	c := &Cluster{ControlPlane: cp, tb: tb}
	tb.Cleanup(c.cleanup)
	if err := c.Boot(); err != nil {
		tb.Fatalf("kube: %v", err)
	}
	tb.Logf("kube: control plane at %s usable %v after Start", c.URL, time.Since(started).Round(time.Millisecond))
	return c
}

// binaries returns the directory of the binaries, or skips or fails tb.
func binaries(tb testing.TB, opts Options) string {
	tb.Helper()
	dir := os.Getenv(EnvBin)
	if dir == "" {
		root, err := repo.Root()
		if err != nil {
			tb.Fatalf("kube: %v; set %s", err, EnvBin)
		}
		dir = filepath.Join(root, "_out", "cluster", "bin")
	}
	for _, n := range controlplane.Binaries(opts) {
		need.Built(tb, filepath.Join(dir, n), "cluster", EnvBin)
	}
	return dir
}

// UserConfig returns a client configuration for a user authenticated by a
// client certificate from the cluster CA: user system:node:NAME in group
// system:nodes is a node as the Node authorizer knows it.
func (c *Cluster) UserConfig(user string, groups ...string) *rest.Config {
	c.tb.Helper()
	cfg, err := c.ControlPlane.UserConfig(user, groups...)
	if err != nil {
		c.tb.Fatalf("kube: %v", err)
	}
	return cfg
}

// StartAPIServer starts kube-apiserver, on the same port as before if it
// ran before, and waits until /readyz answers ok.
func (c *Cluster) StartAPIServer() {
	c.tb.Helper()
	start := time.Now()
	if err := c.ControlPlane.StartAPIServer(); err != nil {
		c.tb.Fatalf("kube: %v", err)
	}
	c.tb.Logf("kube: kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
}

// StopAPIServer stops kube-apiserver and waits until it has exited; the
// rest keeps running. It stops gracefully on SIGTERM (clients see their
// watches end) in about a second, else by SIGKILL after 5 s.
func (c *Cluster) StopAPIServer() {
	c.tb.Helper()
	start := time.Now()
	killed, err := c.ControlPlane.StopAPIServer()
	if err != nil {
		c.tb.Fatal(err)
	}
	how := "on SIGTERM"
	if killed {
		how = "by SIGKILL"
	}
	c.tb.Logf("kube: kube-apiserver stopped %s in %v", how, time.Since(start).Round(time.Millisecond))
}

// RestartAPIServer stops and starts kube-apiserver.
func (c *Cluster) RestartAPIServer() {
	c.tb.Helper()
	c.StopAPIServer()
	c.StartAPIServer()
}

// Stop stops every process and waits until each has exited. tb.Cleanup
// calls it too; calling it more than once does nothing. The shared cluster
// cannot be stopped by a test: Main stops it after the tests.
func (c *Cluster) Stop() {
	c.tb.Helper()
	if c.shared {
		c.tb.Fatal("kube: Stop on the shared cluster; kube.Main stops it after the last test")
	}
	if err := c.ControlPlane.Stop(); err != nil {
		c.tb.Error(err)
	}
}

func (c *Cluster) cleanup() {
	if err := c.ControlPlane.Stop(); err != nil {
		c.tb.Error(err)
	}
	if c.tb.Failed() {
		c.tb.Logf("kube: %s", c.Tails(40))
	}
}
