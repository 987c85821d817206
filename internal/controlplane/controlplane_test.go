package controlplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/nsrun"
	testpoll "github.com/cairn-os/cairn/test/poll"
)

// TestNetns runs a control plane in a network namespace, listening on an
// address that exists only there, as cairn qemu cluster does: its own
// client reaches it (through the namespace), the kubernetes Service's
// endpoint is that address, the host's namespace cannot reach it, and
// Stop leaves no process.
func TestNetns(t *testing.T) {
	bin := os.Getenv("CAIRN_CLUSTER_BIN")
	for _, n := range Binaries(Options{}) {
		need.Built(t, filepath.Join(bin, n), "cluster", "CAIRN_CLUSTER_BIN")
	}
	name, _ := nsrun.New(t, "controlplane")
	nsrun.IP(t, "-n", name, "addr", "add", "192.0.2.10/32", "dev", "lo")
	addr := netip.MustParseAddr("192.0.2.10")
	c, err := Run(bin, t.TempDir(), Options{Netns: name, Address: addr, Port: 6443})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if c.URL != "https://192.0.2.10:6443" {
		t.Errorf("URL = %s, want https://192.0.2.10:6443", c.URL)
	}
	ctx := context.Background()
	testpoll.Until(t, time.Minute, "the kubernetes Service's endpoint at 192.0.2.10:6443", func() error {
		ep, err := c.Client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(ep.Endpoints) != 1 || ep.Endpoints[0].Addresses[0] != "192.0.2.10" || *ep.Ports[0].Port != 6443 {
			return fmt.Errorf("endpoints %+v, ports %+v", ep.Endpoints, ep.Ports)
		}
		return nil
	})
	if conn, err := net.DialTimeout("tcp", "192.0.2.10:6443", time.Second); err == nil {
		conn.Close()
		t.Error("the API server answers from the host's network namespace, want it only in " + name)
	}
	ps := c.Processes()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if Alive(p.PID) {
			t.Errorf("%s (pid %d) runs after Stop", p.Name, p.PID)
		}
	}
}
