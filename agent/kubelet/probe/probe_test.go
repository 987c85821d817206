package probe

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestDo(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	_, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go gs.Serve(lis)
	defer gs.Stop()
	grpcPort := int32(lis.Addr().(*net.TCPAddr).Port)
	down := "down"

	c := &corev1.Container{Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: int32(port)}}}
	target := Target{Container: c, Host: "127.0.0.1"}
	for _, tc := range []struct {
		name string
		h    corev1.ProbeHandler
		ok   bool
	}{
		{"http ok", corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(port)}}, true},
		{"http named port", corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/x", Port: intstr.FromString("web")}}, true},
		{"http 500", corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/bad", Port: intstr.FromInt(port)}}, false},
		{"http refused", corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(closedPort)}}, false},
		{"tcp ok", corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}, true},
		{"tcp refused", corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(closedPort)}}, false},
		{"grpc serving", corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: grpcPort}}, true},
		{"grpc not serving", corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: grpcPort, Service: &down}}, false},
		{"grpc refused", corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(closedPort)}}, false},
	} {
		err := Do(ctx, nil, &corev1.Probe{ProbeHandler: tc.h}, target)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
