package api

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
)

// TestProbes checks from the node, on loopback only: a ping of 127.0.0.1
// answered, a lookup of localhost from /etc/hosts, a TCP connect to a
// listener and to a closed port; a reader may run none of them.
func TestProbes(t *testing.T) {
	need.Root(t, "a raw ICMP socket for ping")
	b, endpoint := serve(t, &recordingInit{}, t.TempDir())
	op := clientWithRole(t, b, endpoint, machineconfig.RoleOperator)
	ctx := context.Background()

	stream, err := op.Ping(ctx, &machine.PingRequest{Address: "127.0.0.1", Count: 3, Interval: durationpb.New(200 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	replies, err := recvAll(stream)
	if err != nil || len(replies) != 3 {
		t.Fatalf("Ping(127.0.0.1, 3) = %v, %v; want 3 replies", replies, err)
	}
	for i, r := range replies {
		if r.Seq != uint32(i+1) || r.From != "127.0.0.1" || r.Rtt.AsDuration() <= 0 || r.Error != "" {
			t.Errorf("reply %d = %v, want seq %d from 127.0.0.1 with its round trip", i, r, i+1)
		}
	}
	if _, err := recvAll(must(op.Ping(ctx, &machine.PingRequest{Address: "127.0.0.1", Count: 1000}))); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Ping with count 1000 = %v, want InvalidArgument", err)
	}

	lk, err := op.Lookup(ctx, &machine.LookupRequest{Name: "localhost"})
	if err != nil || !slices.ContainsFunc(lk.Addresses, func(a string) bool { return a == "127.0.0.1" || a == "::1" }) {
		t.Errorf("Lookup(localhost) = %v, %v; want loopback", lk, err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cr, err := op.Connect(ctx, &machine.ConnectRequest{Address: l.Addr().String()})
	if err != nil || cr.Remote != l.Addr().String() || !strings.HasPrefix(cr.Local, "127.0.0.1:") {
		t.Errorf("Connect(%s) = %v, %v; want connected from 127.0.0.1", l.Addr(), cr, err)
	}
	closed := l.Addr().String()
	l.Close()
	if _, err := op.Connect(ctx, &machine.ConnectRequest{Address: closed}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Connect(a closed port) = %v, want Unavailable, connection refused", err)
	}
	if _, err := op.Connect(ctx, &machine.ConnectRequest{Address: "no-port"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Connect(no-port) = %v, want InvalidArgument", err)
	}

	rd := clientWithRole(t, b, endpoint, machineconfig.RoleReader)
	if _, err := rd.Connect(ctx, &machine.ConnectRequest{Address: closed}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Connect as a reader = %v, want PermissionDenied", err)
	}
	if _, err := rd.Lookup(ctx, &machine.LookupRequest{Name: "localhost"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Lookup as a reader = %v, want PermissionDenied", err)
	}
}

// must is a stream whose opening cannot fail here.
func must[T any](s T, err error) T {
	if err != nil {
		panic(err)
	}
	return s
}
