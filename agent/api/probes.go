package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/api/machine"
)

// Bounds of the checks from the node.
const (
	defaultPings    = 4
	maxPings        = 100
	defaultPingGap  = time.Second
	minPingGap      = 200 * time.Millisecond
	defaultPingWait = 2 * time.Second
	defaultDialWait = 5 * time.Second
	lookupWait      = 10 * time.Second
	maxProbeWait    = time.Minute
)

// orDefault is d, or def when d is unset.
func orDefault(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.AsDuration()
}

// resolve returns the IP of a literal address or of a name, as Lookup
// finds it.
func resolve(ctx context.Context, host string) (net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip, nil
	}
	ctx, cancel := context.WithTimeout(ctx, lookupWait)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "look up %s: %v", host, err)
	}
	return ips[0], nil
}

// Ping sends ICMP echo requests from the node's network namespace, on a
// raw socket (the agent runs as root), and streams the replies.
func (s *machineServer) Ping(req *machine.PingRequest, stream grpc.ServerStreamingServer[machine.PingReply]) error {
	count, gap, wait := int(req.Count), orDefault(req.Interval, defaultPingGap), orDefault(req.Timeout, defaultPingWait)
	if count == 0 {
		count = defaultPings
	}
	switch {
	case count > maxPings:
		return status.Errorf(codes.InvalidArgument, "count %d: at most %d", count, maxPings)
	case gap < minPingGap:
		return status.Errorf(codes.InvalidArgument, "interval %s: at least %s", gap, minPingGap)
	case wait <= 0 || wait > maxProbeWait:
		return status.Errorf(codes.InvalidArgument, "timeout %s: more than 0, at most %s", wait, maxProbeWait)
	}
	ip, err := resolve(stream.Context(), req.Address)
	if err != nil {
		return err
	}
	network, proto, echo, reply := "ip4:icmp", 1, icmp.Type(ipv4.ICMPTypeEcho), icmp.Type(ipv4.ICMPTypeEchoReply)
	if ip.To4() == nil {
		network, proto, echo, reply = "ip6:ipv6-icmp", 58, ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	conn, err := icmp.ListenPacket(network, "")
	if err != nil {
		return status.Errorf(codes.Internal, "open an ICMP socket: %v", err)
	}
	defer conn.Close()
	id := os.Getpid() & 0xffff
	buf := make([]byte, 1500)
	for seq := 1; seq <= count; seq++ {
		if seq > 1 {
			select {
			case <-stream.Context().Done():
				return stream.Context().Err()
			case <-time.After(gap):
			}
		}
		msg, err := (&icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("cairn node ping")}}).Marshal(nil)
		if err != nil {
			return err
		}
		sent := time.Now()
		if _, err := conn.WriteTo(msg, &net.IPAddr{IP: ip}); err != nil {
			return status.Errorf(codes.Unavailable, "send to %s: %v", ip, err)
		}
		r := &machine.PingReply{Seq: uint32(seq)}
		for {
			conn.SetReadDeadline(sent.Add(wait))
			n, from, err := conn.ReadFrom(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				r.Error = fmt.Sprintf("no reply within %s", wait)
				break
			}
			if err != nil {
				return status.Errorf(codes.Unavailable, "read from %s: %v", ip, err)
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply {
				continue // not an echo reply: another ICMP message
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == seq {
				r.From, r.Rtt = from.String(), durationpb.New(time.Since(sent))
				break
			}
		}
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	return nil
}

// Lookup resolves a name with the node's resolver.
func (s *machineServer) Lookup(ctx context.Context, req *machine.LookupRequest) (*machine.LookupResponse, error) {
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "no name to look up")
	}
	ctx, cancel := context.WithTimeout(ctx, lookupWait)
	defer cancel()
	start := time.Now()
	addrs, err := net.DefaultResolver.LookupHost(ctx, req.Name)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "look up %s: %v", req.Name, err)
	}
	return &machine.LookupResponse{Addresses: addrs, Duration: durationpb.New(time.Since(start))}, nil
}

// Connect opens a TCP connection from the node and closes it.
func (s *machineServer) Connect(ctx context.Context, req *machine.ConnectRequest) (*machine.ConnectResponse, error) {
	wait := orDefault(req.Timeout, defaultDialWait)
	if wait <= 0 || wait > maxProbeWait {
		return nil, status.Errorf(codes.InvalidArgument, "timeout %s: more than 0, at most %s", wait, maxProbeWait)
	}
	if _, _, err := net.SplitHostPort(req.Address); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "address %q: want host:port: %v", req.Address, err)
	}
	d := net.Dialer{Timeout: wait}
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", req.Address)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "connect to %s: %v", req.Address, err)
	}
	took := time.Since(start)
	defer c.Close()
	return &machine.ConnectResponse{Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String(), Duration: durationpb.New(took)}, nil
}
