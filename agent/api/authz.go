package api

import (
	"context"
	"crypto/x509"
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
	"Version":        machineconfig.RoleReader,
	"Services":       machineconfig.RoleReader,
	"Logs":           machineconfig.RoleReader,
	"Containers":     machineconfig.RoleReader,
	"PodLogs":        machineconfig.RoleReader,
	"Events":         machineconfig.RoleReader,
	"Audit":          machineconfig.RoleOperator,
	"Reboot":         machineconfig.RoleOperator,
	"Shutdown":       machineconfig.RoleOperator,
	"ServiceRestart": machineconfig.RoleOperator,
	"ApplyConfig":    machineconfig.RoleOperator,
	"ConfirmConfig":  machineconfig.RoleOperator,
	"Upgrade":        machineconfig.RoleOperator,
	"Rollback":       machineconfig.RoleOperator,
	// Checks from the node send traffic from it.
	"Ping":    machineconfig.RoleOperator,
	"Lookup":  machineconfig.RoleOperator,
	"Connect": machineconfig.RoleOperator,

	// Inspection: readers, who never get a secret (see readDenied).
	"Dmesg":     machineconfig.RoleReader,
	"Mounts":    machineconfig.RoleReader,
	"Processes": machineconfig.RoleReader,
	"Network":   machineconfig.RoleReader,
	"Read":      machineconfig.RoleReader,
}

var roleRank = map[string]int{
	machineconfig.RoleReader:   1,
	machineconfig.RoleOperator: 2,
	machineconfig.RoleAdmin:    3,
}

func authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// clientCert is the caller's verified client certificate.
func clientCert(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.VerifiedChains) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	return tlsInfo.State.VerifiedChains[0][0], nil
}

// methodName is the last element of a gRPC method's full name.
func methodName(fullMethod string) string {
	return fullMethod[strings.LastIndex(fullMethod, "/")+1:]
}

// authorize checks the caller's role, read from its verified client
// certificate, against the method it calls.
func authorize(ctx context.Context, fullMethod string) error {
	cert, err := clientCert(ctx)
	if err != nil {
		return err
	}
	role, ok := machineconfig.RoleFromCert(cert)
	if !ok {
		return status.Error(codes.PermissionDenied, "client certificate carries no role")
	}
	method := methodName(fullMethod)
	if !allowed(role, method) {
		need := minRole[method]
		if need == "" {
			need = machineconfig.RoleAdmin
		}
		return status.Errorf(codes.PermissionDenied, "%s needs role %s, the client has %s", method, need, role)
	}
	return nil
}

// allowed says whether role may call method.
func allowed(role, method string) bool {
	need, listed := minRole[method]
	if !listed {
		need = machineconfig.RoleAdmin
	}
	return roleRank[role] >= roleRank[need]
}

// callerMay says whether the caller of ctx may call method.
func callerMay(ctx context.Context, method string) bool {
	cert, err := clientCert(ctx)
	if err != nil {
		return false
	}
	role, ok := machineconfig.RoleFromCert(cert)
	return ok && allowed(role, method)
}
