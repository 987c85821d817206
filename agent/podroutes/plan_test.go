package podroutes

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/machineconfig"
)

func testNode(name string, age int, cidr string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000-age), 0))}}
	if cidr != "" {
		n.Spec.PodCIDRs = strings.Split(cidr, ",")
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

// near is on-link for 10.0.0.0/24 only.
func near(a netip.Addr) (bool, error) { return netip.MustParsePrefix("10.0.0.0/24").Contains(a), nil }

func TestPlan(t *testing.T) {
	nodes := []*corev1.Node{
		testNode("me", 5, "10.244.0.0/24,fd00:244::/64", "10.0.0.1"),
		// Newer than b, so b's claim wins.
		testNode("a-late", 1, "10.244.1.128/25", "10.0.0.9"),
		testNode("b", 3, "10.244.1.0/24", "10.0.0.2"),
		testNode("far", 2, "10.244.2.0/24,fd00:244:2::/64", "10.9.0.3", "fd00::3"),
		testNode("registering", 0, "10.244.3.0/24"),
		testNode("bad", 0, "10.244.4.1/24", "10.0.0.4"),
		testNode("in-services", 0, "10.96.5.0/24", "10.0.0.5"),
		testNode("same-address", 0, "10.244.6.0/24", "10.0.0.1"),
	}
	services := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	s, routes, refused, err := plan("me", machineconfig.PodNetworkAuto, services, nodes, near)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.cidrs) != 2 || s.addrs[false] != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("self = %+v", s)
	}
	var got []string
	for _, r := range routes {
		got = append(got, r.node+" "+r.cidr.String()+" "+r.via.String()+map[bool]string{true: " vxlan"}[r.vxlan])
	}
	// far's IPv6 CIDR needs an IPv6 address of this node for its tunnel.
	want := "b 10.244.1.0/24 10.0.0.2"
	if strings.Join(got, "; ") != want {
		t.Errorf("routes %q, want %q", got, want)
	}
	whys := map[string]string{}
	for _, r := range refused {
		whys[r.node.Name] = r.why
	}
	for name, part := range map[string]string{
		"a-late":       "overlaps 10.244.1.0/24 of Node b",
		"in-services":  "its pod CIDR 10.96.5.0/24 overlaps 10.96.0.0/16 of the Service range",
		"same-address": "its InternalIP 10.0.0.1 is this node's",
		"far":          "no InternalIP of its pod CIDR fd00:244:2::/64's family",
		"bad":          `"10.244.4.1/24" is not a network`,
	} {
		if !strings.Contains(whys[name], part) {
			t.Errorf("%s refused for %q, want %q", name, whys[name], part)
		}
	}
	if len(refused) != 5 {
		t.Errorf("refused %+v, want a-late, far, bad, in-services and same-address only (registering has no address yet)", refused)
	}

	if _, _, _, err := plan("gone", machineconfig.PodNetworkAuto, services, nodes, near); err == nil {
		t.Error("plan without this node's Node succeeded")
	}
	// This node's own pod CIDR in the Service range: nothing is routed.
	_, _, _, err = plan("me", machineconfig.PodNetworkAuto, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, nodes, near)
	if err == nil || !strings.Contains(err.Error(), "this Node's pod CIDR 10.244.0.0/24 overlaps the Service range 10.244.0.0/16") {
		t.Errorf("plan with this node's pod CIDR in the Service range = %v", err)
	}
}
