package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/internal/inns"
	"github.com/cairn-os/cairn/qemu"
)

// bridge is the nodes' L2 network in the cluster's network namespace.
const bridge = "br0"

// network is the cluster's network namespace: a bridge that the nodes'
// second NICs (taps) are on and that holds the control plane's address.
// Nothing routes out of it.
type network struct {
	netns  string
	prefix netip.Prefix
	taps   []*os.File
}

// host is the control plane's address on the bridge: the prefix's first.
func (n *network) host() netip.Addr { return n.prefix.Addr().Next() }

// nodeAddr is node i's (from 0) address on the bridge: .11, .12, …
func (n *network) nodeAddr(i int) netip.Addr {
	a := n.prefix.Addr()
	for range 11 + i {
		a = a.Next()
	}
	return a
}

// nodeMAC is node i's MAC address on the bridge, locally administered.
func nodeMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x00, 0x89, byte(i >> 8), byte(i)}
}

// newNetwork makes the network namespace netns with the bridge holding
// the host address, and a tap on the bridge for each of n nodes. On an
// error, nothing is left.
func newNetwork(netns string, prefix netip.Prefix, n int) (_ *network, err error) {
	if max := 1<<(prefix.Addr().BitLen()-prefix.Bits()) - 12; n > max {
		return nil, fmt.Errorf("network %s holds at most %d nodes", prefix, max)
	}
	if err := ip("netns", "add", netns); err != nil {
		return nil, fmt.Errorf("%w (is a cluster of that name running? cairn qemu cluster destroy removes it)", err)
	}
	nw := &network{netns: netns, prefix: prefix}
	defer func() {
		if err != nil {
			err = errors.Join(err, nw.remove())
		}
	}()
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", bridge, "type", "bridge"},
		{"addr", "add", netip.PrefixFrom(nw.host(), prefix.Bits()).String(), "dev", bridge},
		{"link", "set", bridge, "up"},
	} {
		if err := ip(append([]string{"-n", netns}, args...)...); err != nil {
			return nil, err
		}
	}
	for i := range n {
		name := fmt.Sprintf("tap%d", i)
		f, err := openTap(netns, name)
		if err != nil {
			return nil, err
		}
		nw.taps = append(nw.taps, f)
		if err := ip("-n", netns, "link", "set", name, "master", bridge, "up"); err != nil {
			return nil, err
		}
	}
	return nw, nil
}

// tap is node i's NIC on the bridge, for QEMU.
func (n *network) tap(i int) qemu.Tap { return qemu.Tap{File: n.taps[i], MAC: nodeMAC(i)} }

// remove closes the taps (which removes them) and deletes the namespace
// with the bridge.
func (n *network) remove() error {
	for _, f := range n.taps {
		f.Close()
	}
	n.taps = nil
	return removeNetns(n.netns)
}

// removeNetns deletes the network namespace netns if it exists.
func removeNetns(netns string) error {
	if _, err := os.Stat("/run/netns/" + netns); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return ip("netns", "del", netns)
}

// openTap creates the tap device name in the network namespace netns and
// returns it open; it goes when the last copy of the file closes.
func openTap(netns, name string) (*os.File, error) {
	var fd int
	err := inns.Do(netns, func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("create tap %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// ip runs ip(8).
func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
