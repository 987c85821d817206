package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Network reads the links, addresses and routes of the agent's network
// namespace (the host's on a node) over netlink, and its nftables ruleset
// (nftRuleset).
func (s *machineServer) Network(ctx context.Context, _ *machine.NetworkRequest) (*machine.NetworkResponse, error) {
	links, err := vnl.LinkList()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list links: %v", err)
	}
	resp := &machine.NetworkResponse{}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		link := &machine.Link{Name: a.Name, Index: int32(a.Index), State: a.OperState.String(), Mtu: int32(a.MTU), Mac: a.HardwareAddr.String(), Type: l.Type()}
		addrs, err := vnl.AddrList(l, vnl.FAMILY_ALL)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list addresses of %s: %v", a.Name, err)
		}
		for _, ad := range addrs {
			link.Addresses = append(link.Addresses, ad.IPNet.String())
		}
		resp.Links = append(resp.Links, link)
	}
	// Every table, not only main: local and policy routing tables too.
	routes, err := vnl.RouteListFiltered(vnl.FAMILY_ALL, &vnl.Route{Table: unix.RT_TABLE_UNSPEC}, vnl.RT_FILTER_TABLE)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list routes: %v", err)
	}
	for _, r := range routes {
		route := &machine.Route{Destination: "default", Device: names[r.LinkIndex], Table: uint32(r.Table), Metric: int32(r.Priority), Type: routeType(r.Type)}
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones > 0 { // netlink writes a default route as 0.0.0.0/0
				route.Destination = r.Dst.String()
			}
		}
		if r.Gw != nil {
			route.Gateway = r.Gw.String()
		}
		if r.Src != nil {
			route.Source = r.Src.String()
		}
		resp.Routes = append(resp.Routes, route)
	}
	resp.Nftables, err = nftRuleset(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "nftables: %v", err)
	}
	if resp.Sockets, err = sockets(); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return resp, nil
}

// routeType names an RTN_* route type as ip-route(8) does.
func routeType(t int) string {
	switch t {
	case unix.RTN_UNICAST:
		return "unicast"
	case unix.RTN_LOCAL:
		return "local"
	case unix.RTN_BROADCAST:
		return "broadcast"
	case unix.RTN_ANYCAST:
		return "anycast"
	case unix.RTN_MULTICAST:
		return "multicast"
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	}
	return strconv.Itoa(t)
}

// nftRuleset is what `nft list ruleset` prints: nft, which the image has
// for the CNI plugins, renders the kernel's tables in the words operators
// read, every expression included.
func nftRuleset(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nft", "list", "ruleset").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("nft list ruleset: %w: %s", err, bytes.TrimSpace(exit.Stderr))
		}
		return "", fmt.Errorf("nft list ruleset: %w", err)
	}
	return string(out), nil
}
