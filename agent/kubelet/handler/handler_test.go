package handler

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestRun(t *testing.T) {
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
		a    Action
		ok   bool
	}{
		{"http ok", Action{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(port)}}, true},
		{"http named port", Action{HTTPGet: &corev1.HTTPGetAction{Path: "/x", Port: intstr.FromString("web")}}, true},
		{"http 500", Action{HTTPGet: &corev1.HTTPGetAction{Path: "/bad", Port: intstr.FromInt(port)}}, false},
		{"http refused", Action{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(closedPort)}}, false},
		{"tcp ok", Action{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}, true},
		{"tcp refused", Action{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(closedPort)}}, false},
		{"grpc serving", Action{GRPC: &corev1.GRPCAction{Port: grpcPort}}, true},
		{"grpc not serving", Action{GRPC: &corev1.GRPCAction{Port: grpcPort, Service: &down}}, false},
		{"grpc refused", Action{GRPC: &corev1.GRPCAction{Port: int32(closedPort)}}, false},
		{"sleep", Action{Sleep: &corev1.SleepAction{Seconds: 0}}, true},
		{"sleep past the timeout", Action{Sleep: &corev1.SleepAction{Seconds: 2}}, false},
		{"no action", Action{}, false},
	} {
		err := Run(ctx, nil, tc.a, time.Second, target)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
