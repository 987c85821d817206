package api

import (
	"context"
	"strings"

	"github.com/cairn-os/cairn/machineconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// minRole is the least role allowed to call each method; a method not
// listed needs admin.
var minRole = map[string]string{
	"Version":  machineconfig.RoleReader,
	"Reboot":   machineconfig.RoleOperator,
	"Shutdown": machineconfig.RoleOperator,
}

var roleRank = map[string]int{
	machineconfig.RoleReader:   1,
	machineconfig.RoleOperator: 2,
	machineconfig.RoleAdmin:    3,
}

// authorize checks the caller's role, read from its verified client
// certificate, against the method it calls.
func authorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.VerifiedChains) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	role, ok := machineconfig.RoleFromCert(tlsInfo.State.VerifiedChains[0][0])
	if !ok {
		return nil, status.Error(codes.PermissionDenied, "client certificate carries no role")
	}
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	need, listed := minRole[method]
	if !listed {
		need = machineconfig.RoleAdmin
	}
	if roleRank[role] < roleRank[need] {
		return nil, status.Errorf(codes.PermissionDenied, "%s needs role %s, the client has %s", method, need, role)
	}
	return h(ctx, req)
}
