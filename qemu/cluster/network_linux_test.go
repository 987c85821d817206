package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNetwork makes a cluster's network for three nodes and wants the
// namespace with the bridge on the host address and a tap per node on it,
// open; remove leaves nothing.
func TestNetwork(t *testing.T) {
	netns := fmt.Sprintf("cairn-test-%d", os.Getpid())
	nw, err := newNetwork(netns, netip.MustParsePrefix("10.89.0.0/24"), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeNetns(netns) })
	out, err := exec.Command("ip", "-n", netns, "-o", "addr", "show", "dev", bridge).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "inet 10.89.0.1/24") {
		t.Errorf("bridge %s: %v\n%s\nwant 10.89.0.1/24 on it", bridge, err, out)
	}
	out, err = exec.Command("ip", "-n", netns, "-o", "link", "show", "master", bridge).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if !strings.Contains(string(out), fmt.Sprintf("tap%d:", i)) {
			t.Errorf("links on %s:\n%s\nwant tap%d", bridge, out, i)
		}
		if tap := nw.tap(i); tap.File == nil || tap.MAC.String() != fmt.Sprintf("52:54:00:89:00:%02x", i) {
			t.Errorf("tap(%d) = %+v, want an open file and MAC 52:54:00:89:00:%02x", i, tap, i)
		}
	}
	if err := nw.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/netns/" + netns); !os.IsNotExist(err) {
		t.Errorf("namespace %s after remove: %v, want it gone", netns, err)
	}
	if _, err := newNetwork(netns, netip.MustParsePrefix("10.89.0.0/28"), 5); err == nil || !strings.Contains(err.Error(), "at most 4 nodes") {
		t.Errorf("5 nodes on a /28: %v, want refused: at most 4 nodes", err)
	}
}

// TestAddresses checks the addresses a cluster hands out on its network.
func TestAddresses(t *testing.T) {
	nw := &network{prefix: netip.MustParsePrefix("10.89.0.0/24")}
	if got := nw.host().String(); got != "10.89.0.1" {
		t.Errorf("host() = %s, want 10.89.0.1", got)
	}
	for i, want := range []string{"10.89.0.11", "10.89.0.12", "10.89.0.20"} {
		if i == 2 {
			i = 9
		}
		if got := nw.nodeAddr(i).String(); got != want {
			t.Errorf("nodeAddr(%d) = %s, want %s", i, got, want)
		}
	}
}

// TestReadStateMissing wants a clear error for a directory without a
// cluster.
func TestReadStateMissing(t *testing.T) {
	_, err := ReadState(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "cairn qemu cluster create makes one") {
		t.Errorf("ReadState(empty dir) = %v, want an error saying how to make a cluster", err)
	}
}
