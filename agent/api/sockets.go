package api

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/api/machine"
)

// tcpStates names the kernel's TCP states (include/net/tcp_states.h) as
// ss does.
var tcpStates = map[uint8]string{
	1: "ESTAB", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 5: "FIN-WAIT-2", 6: "TIME-WAIT",
	7: "UNCONN", 8: "CLOSE-WAIT", 9: "LAST-ACK", 10: "LISTEN", 11: "CLOSING",
}

// sockets lists the TCP and UDP sockets of the agent's network namespace
// (the node's) through sock_diag, each with the process that has it open.
func sockets() ([]*machine.Socket, error) {
	owners := socketOwners()
	var out []*machine.Socket
	for _, q := range []struct {
		proto  string
		family uint8
		list   func(uint8) ([]*vnl.Socket, error)
	}{
		{"tcp", unix.AF_INET, vnl.SocketDiagTCP}, {"tcp6", unix.AF_INET6, vnl.SocketDiagTCP},
		{"udp", unix.AF_INET, vnl.SocketDiagUDP}, {"udp6", unix.AF_INET6, vnl.SocketDiagUDP},
	} {
		socks, err := q.list(q.family)
		if err != nil {
			return nil, fmt.Errorf("list %s sockets: %w", q.proto, err)
		}
		for _, s := range socks {
			ms := &machine.Socket{
				Protocol: q.proto,
				State:    tcpStates[s.State],
				Local:    net.JoinHostPort(s.ID.Source.String(), strconv.Itoa(int(s.ID.SourcePort))),
				Remote:   net.JoinHostPort(s.ID.Destination.String(), strconv.Itoa(int(s.ID.DestinationPort))),
				Uid:      s.UID,
			}
			if o, ok := owners[s.INode]; ok {
				ms.Pid, ms.Command = int32(o.pid), o.comm
			}
			out = append(out, ms)
		}
	}
	return out, nil
}

type socketOwner struct {
	pid  int
	comm string
}

// socketOwners maps socket inodes to a process that has them open, from
// the file descriptors in /proc; a process it may not read is skipped.
func socketOwners() map[uint32]socketOwner {
	owners := map[uint32]socketOwner{}
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return owners
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return owners
	}
	for _, p := range procs {
		targets, err := p.FileDescriptorTargets()
		if err != nil {
			continue
		}
		comm, _ := p.Comm()
		for _, t := range targets {
			ino, ok := strings.CutPrefix(t, "socket:[")
			if !ok {
				continue
			}
			if n, err := strconv.ParseUint(strings.TrimSuffix(ino, "]"), 10, 32); err == nil {
				if _, seen := owners[uint32(n)]; !seen {
					owners[uint32(n)] = socketOwner{pid: p.PID, comm: comm}
				}
			}
		}
	}
	return owners
}
