package podroutes

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/nsrun"
	"github.com/cairn-os/cairn/test/poll"
)

func TestMain(m *testing.M) {
	os.Exit(kube.Main(m, kube.Options{}))
}

// The test topology: three dual-stack "nodes", each a network namespace.
// Nodes 1 and 2 share a network (a bridge in the "lan" namespace); node 3
// is on another one, behind a router that node 1 and 2 route
// 198.18.60.0/24 and fd00:18:60::/64 through.
//
//	node 1 198.18.50.1 ─┐
//	                    lan ── 198.18.50.254 router 198.18.60.254 ── 198.18.60.3 node 3
//	node 2 198.18.50.2 ─┘
//
// Node i's pod CIDRs are 198.19.i.0/24 and fd00:19:i::/64 (IPv6
// addresses are the IPv4 ones' last numbers under fd00:18:50::,
// fd00:18:60:: and fd00:19:i::), and "pod" addresses 198.19.i.5 and
// fd00:19:i::5 stand on a link of the node's namespace, with a TCP server
// that answers its node's name. The Nodes are real objects of the test's
// API server, named after the test, and the Routers watch them.
type topology struct {
	t     testing.TB
	kube  kubernetes.Interface
	names [5]string // the Nodes' names, by node number (0 and 4 have no namespace)
	ns    [5]string
	h     [5]netns.NsHandle
	// services are the Service ranges the Routers are given.
	services []netip.Prefix
}

func nodeIP(i int) string {
	switch i {
	case 0, 4: // Nodes with no namespace of their own
		return fmt.Sprintf("198.18.50.%d", 4+i/4)
	case 3:
		return "198.18.60.3"
	}
	return fmt.Sprintf("198.18.50.%d", i)
}

// nodeIP6 is node i's IPv6 InternalIP.
func nodeIP6(i int) string {
	a := strings.Split(nodeIP(i), ".")
	return fmt.Sprintf("fd00:18:%s::%s", a[2], a[3])
}

func podCIDR(i int) string  { return fmt.Sprintf("198.19.%d.0/24", i) }
func podCIDR6(i int) string { return fmt.Sprintf("fd00:19:%d::/64", i) }

// podIP is node i's pod address of a family.
func podIP(i int, six bool) string {
	if six {
		return fmt.Sprintf("fd00:19:%d::5", i)
	}
	return fmt.Sprintf("198.19.%d.5", i)
}

func newTopology(t testing.TB) *topology {
	t.Helper()
	need.Root(t, "network namespaces")
	need.Tool(t, "ip", "iproute2")
	c := kube.Shared(t)
	tp := &topology{t: t, kube: c.Client}
	lan, _ := nsrun.New(t, "lan")
	router, rh := nsrun.New(t, "router")
	nsrun.IP(t, "-n", lan, "link", "add", "br0", "type", "bridge")
	nsrun.IP(t, "-n", lan, "link", "set", "br0", "up")
	nsrun.In(t, rh, func() {
		sysctl(t, "net.ipv4.ip_forward", "1")
		sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	})
	for i := 1; i <= 3; i++ {
		tp.names[i] = fmt.Sprintf("%s-%d", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), i)
		tp.ns[i], tp.h[i] = nsrun.New(t, fmt.Sprintf("node%d", i))
		peer, peerNS, gw := "lan", lan, "198.18.50.254"
		if i == 3 {
			peer, peerNS, gw = "r3", router, "198.18.60.254"
		} else {
			peer = fmt.Sprintf("lan%d", i)
		}
		nsrun.IP(t, "-n", tp.ns[i], "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", peerNS)
		nsrun.IP(t, "-n", tp.ns[i], "addr", "add", nodeIP(i)+"/24", "dev", "eth0")
		nsrun.IP(t, "-n", tp.ns[i], "addr", "add", nodeIP6(i)+"/64", "dev", "eth0", "nodad")
		nsrun.IP(t, "-n", tp.ns[i], "link", "set", "eth0", "up")
		gw6 := strings.Replace(nodeIP6(i), fmt.Sprintf("::%d", i), "::254", 1)
		if i != 3 {
			nsrun.IP(t, "-n", lan, "link", "set", peer, "master", "br0", "up")
			nsrun.IP(t, "-n", tp.ns[i], "route", "add", "198.18.60.0/24", "via", gw)
			nsrun.IP(t, "-n", tp.ns[i], "route", "add", "fd00:18:60::/64", "via", gw6)
		} else {
			nsrun.IP(t, "-n", router, "addr", "add", gw+"/24", "dev", peer)
			nsrun.IP(t, "-n", router, "addr", "add", gw6+"/64", "dev", peer, "nodad")
			nsrun.IP(t, "-n", router, "link", "set", peer, "up")
			nsrun.IP(t, "-n", tp.ns[i], "route", "add", "198.18.50.0/24", "via", gw)
			nsrun.IP(t, "-n", tp.ns[i], "route", "add", "fd00:18:50::/64", "via", gw6)
		}
		nsrun.IP(t, "-n", tp.ns[i], "link", "add", "pod0", "type", "bridge")
		nsrun.IP(t, "-n", tp.ns[i], "addr", "add", podIP(i, false)+"/24", "dev", "pod0")
		nsrun.IP(t, "-n", tp.ns[i], "addr", "add", podIP(i, true)+"/64", "dev", "pod0", "nodad")
		nsrun.IP(t, "-n", tp.ns[i], "link", "set", "pod0", "up")
		tp.serve(i)
	}
	nsrun.IP(t, "-n", lan, "link", "add", "lanr", "type", "veth", "peer", "name", "rlan", "netns", router)
	nsrun.IP(t, "-n", lan, "link", "set", "lanr", "master", "br0", "up")
	nsrun.IP(t, "-n", router, "addr", "add", "198.18.50.254/24", "dev", "rlan")
	nsrun.IP(t, "-n", router, "addr", "add", "fd00:18:50::254/64", "dev", "rlan", "nodad")
	nsrun.IP(t, "-n", router, "link", "set", "rlan", "up")
	return tp
}

// logWriter writes a Router's log lines to the test's log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func sysctl(t testing.TB, key, value string) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

// serve answers node i's name on its pod addresses, port 8080.
func (tp *topology) serve(i int) {
	for _, six := range []bool{false, true} {
		var l net.Listener
		nsrun.In(tp.t, tp.h[i], func() {
			var err error
			if l, err = net.Listen("tcp", net.JoinHostPort(podIP(i, six), "8080")); err != nil {
				tp.t.Fatal(err)
			}
		})
		tp.t.Cleanup(func() { l.Close() })
		go answer(l, i)
	}
}

func answer(l net.Listener, i int) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		fmt.Fprintf(c, "node %d\n", i)
		c.Close()
	}
}

// reach says whether node from's pod address of a family reaches node
// to's pod, and gets its answer.
func (tp *topology) reach(from, to int, six bool) error {
	var err error
	nsrun.In(tp.t, tp.h[from], func() {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(podIP(from, six))}}
		var c net.Conn
		if c, err = d.Dial("tcp", net.JoinHostPort(podIP(to, six), "8080")); err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		var got []byte
		if got, err = io.ReadAll(c); err == nil && string(got) != fmt.Sprintf("node %d\n", to) {
			err = fmt.Errorf("answered %q", got)
		}
	})
	return err
}

// addNode makes the Node of node i with its pod CIDRs and InternalIPs,
// or cidr alone instead if set; the test deletes it at its end.
func (tp *topology) addNode(i int, cidr string) {
	tp.t.Helper()
	cidrs := []string{podCIDR(i), podCIDR6(i)}
	if cidr != "" {
		cidrs = []string{cidr}
	}
	ctx := context.Background()
	nodes := tp.kube.CoreV1().Nodes()
	_, err := nodes.Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: tp.names[i]},
		Spec:       corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
	}, metav1.CreateOptions{})
	if err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(func() { tp.deleteNode(i) })
	// The controller manager writes the new Node too.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, tp.names[i], metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP(i)}, {Type: corev1.NodeInternalIP, Address: nodeIP6(i)},
			{Type: corev1.NodeHostName, Address: tp.names[i]}}
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		tp.t.Fatal(err)
	}
}

func (tp *topology) deleteNode(i int) {
	err := tp.kube.CoreV1().Nodes().Delete(context.Background(), tp.names[i], metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		tp.t.Error(err)
	}
}

// run starts node i's Router in mode until the test ends.
func (tp *topology) run(i int, mode string) *Router {
	tp.t.Helper()
	h, err := netlink.NewHandleAt(tp.h[i], unix.NETLINK_ROUTE)
	if err != nil {
		tp.t.Fatal(err)
	}
	r, err := New(Config{NodeName: tp.names[i], Mode: mode, Netlink: h, ServiceCIDRs: tp.services,
		Logger: slog.New(slog.NewTextHandler(logWriter{tp.t}, nil)).With("node", i)})
	if err != nil {
		tp.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	nodes := node.NodesInformer(tp.kube)
	go nodes.Run(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, tp.kube, nodes) }()
	tp.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tp.t.Errorf("node %d's Router: %v", i, err)
		}
		h.Close()
	})
	return r
}

// routes returns node i's routes of protocol proto, IPv4 and IPv6, as ip
// route shows them.
func (tp *topology) routes(i int, proto string) string {
	out, err := exec.Command("sh", "-c", fmt.Sprintf("ip -n %s route show proto %s && ip -n %[1]s -6 route show proto %[2]s", tp.ns[i], proto)).CombinedOutput()
	if err != nil {
		tp.t.Fatalf("ip route: %v\n%s", err, out)
	}
	return string(out)
}

func (tp *topology) ip(i int, args ...string) string {
	out, err := exec.Command("ip", append([]string{"-n", tp.ns[i]}, args...)...).CombinedOutput()
	if err != nil {
		tp.t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// waitRoutes waits until node i's routes are want, one per line in any
// order, each as ip route prints it.
func (tp *topology) waitRoutes(i int, want ...string) {
	tp.t.Helper()
	poll.Until(tp.t, 30*time.Second, fmt.Sprintf("node %d's pod routes %q", i, want), func() error {
		got := strings.Split(strings.TrimSpace(tp.routes(i, "202")), "\n")
		if len(got) == 1 && got[0] == "" {
			got = nil
		}
		for _, w := range want {
			found := false
			for _, g := range got {
				found = found || strings.HasPrefix(strings.TrimSpace(g), w)
			}
			if !found {
				return fmt.Errorf("routes:\n%s", strings.Join(got, "\n"))
			}
		}
		if len(got) != len(want) {
			return fmt.Errorf("routes:\n%s", strings.Join(got, "\n"))
		}
		return nil
	})
}

// waitReach waits until node from's pods reach node to's, over IPv4 and
// IPv6.
func (tp *topology) waitReach(from, to int) {
	tp.t.Helper()
	for _, six := range []bool{false, true} {
		poll.Until(tp.t, 30*time.Second, fmt.Sprintf("node %d's pod reaches node %d's (IPv6 %v)", from, to, six), func() error { return tp.reach(from, to, six) })
	}
}

// waitEvent waits for an Event on node i's Node with reason and a message
// holding part.
func (tp *topology) waitEvent(i int, reason, part string) {
	tp.t.Helper()
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": tp.names[i], "reason": reason}.String()
	poll.Until(tp.t, 30*time.Second, fmt.Sprintf("a %s Event on Node %s", reason, tp.names[i]), func() error {
		evs, err := tp.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, part) {
				return nil
			}
		}
		return fmt.Errorf("events: %v", evs.Items)
	})
}

func waitReady(t *testing.T, r *Router, wantPart string) {
	t.Helper()
	poll.Until(t, 30*time.Second, "the Router ready", func() error {
		if ok, why := r.Ready(); !ok || !strings.Contains(why, wantPart) {
			return fmt.Errorf("Ready() = %v, %q; want true and %q", ok, why, wantPart)
		}
		return nil
	})
}

// TestHostGW routes the pods of nodes on the same network through their
// InternalIPs. A node behind a router cannot be reached so and is
// refused, as is one whose pod CIDR overlaps another's, until that one
// is gone; a deleted Node's route goes. Routes of other protocols, and of this one that a Router
// before left behind, are told apart.
func TestHostGW(t *testing.T) {
	tp := newTopology(t)
	// A route of the agent's protocol that no Node calls for, left by an
	// agent before, and someone else's.
	tp.ip(1, "route", "add", "198.19.99.0/24", "via", "198.18.50.2", "proto", "202")
	tp.ip(1, "route", "add", "198.19.98.0/24", "via", "198.18.50.2", "proto", "static")
	for i := 1; i <= 3; i++ {
		tp.addNode(i, "")
	}
	tp.services = []netip.Prefix{netip.MustParsePrefix("198.19.200.0/24")}
	r1 := tp.run(1, machineconfig.PodNetworkHostGW)
	if ok, why := r1.Ready(); ok || why == "" {
		t.Errorf("Ready() before any sync = %v, %q; want false and why", ok, why)
	}
	tp.run(2, machineconfig.PodNetworkHostGW)
	tp.waitRoutes(1, "198.19.2.0/24 via 198.18.50.2 dev eth0", "fd00:19:2::/64 via fd00:18:50::2 dev eth0")
	tp.waitRoutes(2, "198.19.1.0/24 via 198.18.50.1 dev eth0", "fd00:19:1::/64 via fd00:18:50::1 dev eth0")
	if !strings.Contains(tp.routes(1, "static"), "198.19.98.0/24 via 198.18.50.2") {
		t.Errorf("someone else's route is gone:\n%s", tp.ip(1, "route"))
	}
	tp.waitReach(1, 2)
	tp.waitReach(2, 1)
	tp.waitEvent(3, ReasonRefused, "198.18.60.3 is not on a network this node is on")
	waitReady(t, r1, "1 nodes refused")
	if strings.Contains(tp.ip(1, "link"), "cairn.vx") {
		t.Errorf("host-gw made a VXLAN device:\n%s", tp.ip(1, "link"))
	}

	// A fourth Node claiming half of node 2's pod CIDR.
	tp.names[0] = tp.names[3] + "-overlap"
	tp.addNode(0, "198.19.2.128/25")
	tp.waitEvent(0, ReasonRefused, "overlaps 198.19.2.0/24 of Node "+tp.names[2])
	tp.waitRoutes(1, "198.19.2.0/24 via 198.18.50.2 dev eth0", "fd00:19:2::/64 via fd00:18:50::2 dev eth0")

	// A Node in the Service range is refused; a Router whose own Node is
	// in it routes nothing, and says why.
	tp.names[4] = tp.names[3] + "-in-services"
	tp.addNode(4, "198.19.200.0/25")
	tp.waitEvent(4, ReasonRefused, "its pod CIDR 198.19.200.0/25 overlaps 198.19.200.0/24 of the Service range")
	tp.services = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}
	r2 := tp.run(2, machineconfig.PodNetworkHostGW)
	poll.Until(t, 30*time.Second, "a Router of node 2 with its pod CIDR in the Service range not ready", func() error {
		ok, why := r2.Ready()
		if ok || !strings.Contains(why, "this Node's pod CIDR 198.19.2.0/24 overlaps the Service range 198.19.0.0/16") {
			return fmt.Errorf("Ready() = %v, %q", ok, why)
		}
		return nil
	})
	tp.waitRoutes(2, "198.19.1.0/24 via 198.18.50.1 dev eth0", "fd00:19:1::/64 via fd00:18:50::1 dev eth0")

	// With node 2's Node gone, its route goes, and the Node that was
	// refused for overlapping it is routed.
	tp.deleteNode(2)
	tp.waitRoutes(1, "198.19.2.128/25 via 198.18.50.4 dev eth0")
	if err := tp.reach(1, 2, false); err == nil {
		t.Error("node 1's pod still reaches node 2's with node 2's Node deleted")
	}
	tp.deleteNode(0)
	tp.waitRoutes(1)
}

// TestVXLAN tunnels to every node, the one behind a router too, and takes
// the tunnel's entries down as Nodes go.
func TestVXLAN(t *testing.T) {
	tp := newTopology(t)
	for i := 1; i <= 3; i++ {
		tp.addNode(i, "")
	}
	r1 := tp.run(1, machineconfig.PodNetworkVXLAN)
	for i := 2; i <= 3; i++ {
		tp.run(i, machineconfig.PodNetworkVXLAN)
	}
	tp.waitRoutes(1, "198.19.2.0/24 via 198.19.2.0 dev cairn.vx4 onlink", "198.19.3.0/24 via 198.19.3.0 dev cairn.vx4 onlink",
		"fd00:19:2::/64 via fd00:19:2:: dev cairn.vx6", "fd00:19:3::/64 via fd00:19:3:: dev cairn.vx6")
	waitReady(t, r1, "4 routes to other nodes' pod CIDRs (4 through VXLAN)")
	for _, p := range [][2]int{{1, 2}, {2, 1}, {1, 3}, {3, 1}, {2, 3}} {
		tp.waitReach(p[0], p[1])
	}
	dev := tp.ip(1, "-d", "link", "show", "cairn.vx4")
	for _, want := range []string{"mtu 1450", "vxlan id 1 local 198.18.50.1", "dstport 8472", "nolearning", "link/ether 0a:58:c6:12:32:01"} {
		if !strings.Contains(dev, want) {
			t.Errorf("cairn.vx4 lacks %q:\n%s", want, dev)
		}
	}
	if fdb := tp.ip(1, "neigh", "show", "dev", "cairn.vx4"); !strings.Contains(fdb, "198.19.3.0 lladdr 0a:58:c6:12:3c:03 PERMANENT") {
		t.Errorf("neighbours of cairn.vx4:\n%s", fdb)
	}
	if dev := tp.ip(1, "-d", "link", "show", "cairn.vx6"); !strings.Contains(dev, "mtu 1430") || !strings.Contains(dev, "local fd00:18:50::1") {
		t.Errorf("cairn.vx6, want MTU 1430 and local fd00:18:50::1:\n%s", dev)
	}
	fdb := func() string {
		out, err := exec.Command("bridge", "-n", tp.ns[1], "fdb", "show", "dev", "cairn.vx4").CombinedOutput()
		if err != nil {
			t.Fatalf("bridge fdb: %v\n%s", err, out)
		}
		return string(out)
	}
	if got := fdb(); !strings.Contains(got, "0a:58:c6:12:3c:03 dst 198.18.60.3 self permanent") {
		t.Errorf("forwarding entries of cairn.vx4:\n%s", got)
	}

	tp.deleteNode(3)
	tp.waitRoutes(1, "198.19.2.0/24 via 198.19.2.0 dev cairn.vx4 onlink", "fd00:19:2::/64 via fd00:19:2:: dev cairn.vx6")
	poll.Until(t, 30*time.Second, "node 3's tunnel entries gone", func() error {
		if got := fdb() + tp.ip(1, "neigh", "show", "dev", "cairn.vx4"); strings.Contains(got, "c6:12:3c:03") {
			return fmt.Errorf("entries:\n%s", got)
		}
		return nil
	})
	tp.deleteNode(2)
	tp.waitRoutes(1)
	poll.Until(t, 30*time.Second, "the VXLAN devices gone", func() error {
		if links := tp.ip(1, "link"); strings.Contains(links, "cairn.vx") {
			return fmt.Errorf("links:\n%s", links)
		}
		return nil
	})
}

// TestAuto routes the node on the same network directly and tunnels to
// the one behind the router.
func TestAuto(t *testing.T) {
	tp := newTopology(t)
	for i := 1; i <= 3; i++ {
		tp.addNode(i, "")
		tp.run(i, machineconfig.PodNetworkAuto)
	}
	tp.waitRoutes(1, "198.19.2.0/24 via 198.18.50.2 dev eth0", "198.19.3.0/24 via 198.19.3.0 dev cairn.vx4 onlink",
		"fd00:19:2::/64 via fd00:18:50::2 dev eth0", "fd00:19:3::/64 via fd00:19:3:: dev cairn.vx6")
	tp.waitRoutes(3, "198.19.1.0/24 via 198.19.1.0 dev cairn.vx4 onlink", "198.19.2.0/24 via 198.19.2.0 dev cairn.vx4 onlink",
		"fd00:19:1::/64 via fd00:19:1:: dev cairn.vx6", "fd00:19:2::/64 via fd00:19:2:: dev cairn.vx6")
	for _, p := range [][2]int{{1, 2}, {1, 3}, {3, 2}} {
		tp.waitReach(p[0], p[1])
	}
}

// addPod puts pod j of node i in a namespace of its own, on the node's
// bridge, at 198.19.i.(10+j) with the bridge's address as its gateway,
// as the CNI bridge plugin does; the node forwards for it.
func (tp *topology) addPod(i, j int) netns.NsHandle {
	tp.t.Helper()
	name, h := nsrun.New(tp.t, fmt.Sprintf("pod%d-%d", i, j))
	veth := fmt.Sprintf("veth%d", j)
	nsrun.IP(tp.t, "-n", tp.ns[i], "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
	nsrun.IP(tp.t, "-n", tp.ns[i], "link", "set", veth, "master", "pod0", "up")
	nsrun.IP(tp.t, "-n", name, "addr", "add", fmt.Sprintf("198.19.%d.%d/24", i, 10+j), "dev", "eth0")
	nsrun.IP(tp.t, "-n", name, "link", "set", "eth0", "up")
	nsrun.IP(tp.t, "-n", name, "route", "add", "default", "via", podIP(i, false))
	nsrun.In(tp.t, tp.h[i], func() { sysctl(tp.t, "net.ipv4.ip_forward", "1") })
	return h
}

// BenchmarkPodToPod times a TCP request and response of one byte each
// (netperf's TCP_RR) between two pods: on the same node through its
// bridge, and on two nodes of one network through a host-gw route and
// through VXLAN. Each "node" and "pod" is a network namespace on this
// machine, so the figures compare the paths' kernel work, not wires.
func BenchmarkPodToPod(b *testing.B) {
	for _, path := range []string{"same-node", machineconfig.PodNetworkHostGW, machineconfig.PodNetworkVXLAN} {
		b.Run(path, func(b *testing.B) {
			tp := newTopology(b)
			client := tp.addPod(1, 1)
			server, to := tp.addPod(1, 2), "198.19.1.12"
			if path != "same-node" {
				server, to = tp.addPod(2, 2), "198.19.2.12"
				for i := 1; i <= 2; i++ {
					tp.addNode(i, "")
					tp.run(i, path)
				}
			}
			var l net.Listener
			nsrun.In(b, server, func() {
				var err error
				if l, err = net.Listen("tcp", to+":9000"); err != nil {
					b.Fatal(err)
				}
			})
			defer l.Close()
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go io.Copy(c, c)
				}
			}()
			var c net.Conn
			poll.Until(b, 30*time.Second, "the server pod reachable", func() error {
				var err error
				nsrun.In(b, client, func() { c, err = net.DialTimeout("tcp", to+":9000", time.Second) })
				return err
			})
			defer c.Close()
			buf := []byte{1}
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rr")
		})
	}
}
