package proxy

import (
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// linuxDataplane is the table in the kernel (over nftables netlink) and the
// conntrack table beside it, in one network namespace.
type linuxDataplane struct {
	*nftProgrammer
	ct *netlink.Handle
	ns *os.File // nil: the current namespace
}

func newDataplane(cfg Config) (dataplane, error) {
	d := &linuxDataplane{}
	fd := -1
	if cfg.NetNS != "" {
		f, err := os.Open(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("open network namespace: %w", err)
		}
		d.ns = f
		fd = int(f.Fd())
	}
	var err error
	if d.nftProgrammer, err = newNFTProgrammer(cfg.Table, fd); err != nil {
		d.close()
		return nil, err
	}
	if fd >= 0 {
		d.ct, err = netlink.NewHandleAt(netns.NsHandle(fd), unix.NETLINK_NETFILTER)
	} else {
		d.ct, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		d.close()
		return nil, fmt.Errorf("open conntrack netlink socket: %w", err)
	}
	return d, nil
}

func (d *linuxDataplane) deleteFlows(filters []flowFilter) (uint, error) {
	return deleteFlows(d.ct, filters)
}

func (d *linuxDataplane) close() error {
	if d.nftProgrammer != nil {
		d.closeTx()
	}
	if d.ct != nil {
		d.ct.Close()
	}
	if d.ns != nil {
		return d.ns.Close()
	}
	return nil
}
