// Command csiregistrar registers a CSI driver with the node, in the
// manner of the upstream node-driver-registrar sidecar (whose module the
// Go proxy here does not serve): it asks the driver at -csi-address its
// name, then serves the kubelet's plugin registration service on a socket
// in -registration-dir, answering GetInfo with that name and the driver's
// socket as the node sees it, -kubelet-registration-path. A registration
// the node refuses ends it, for its pod to restart it, as upstream's.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	csiAddress := flag.String("csi-address", "", "the driver's socket, as this container sees it")
	kubeletPath := flag.String("kubelet-registration-path", "", "the driver's socket, as the node sees it")
	regDir := flag.String("registration-dir", "/registration", "the node's plugins_registry")
	flag.Parse()
	if err := run(*csiAddress, *kubeletPath, *regDir); err != nil {
		log.Fatal(err)
	}
}

func run(csiAddress, kubeletPath, regDir string) error {
	if csiAddress == "" || kubeletPath == "" {
		return errors.New("-csi-address and -kubelet-registration-path are needed")
	}
	name, err := driverName(csiAddress)
	if err != nil {
		return err
	}
	sock := filepath.Join(regDir, name+"-reg.sock")
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, &registrar{name: name, endpoint: kubeletPath})
	log.Printf("registering driver %s (%s) at %s", name, kubeletPath, sock)
	return s.Serve(l)
}

// driverName asks the driver its name, waiting for it to serve.
func driverName(addr string) (string, error) {
	conn, err := grpc.NewClient("unix:"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := csipb.NewIdentityClient(conn).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return "", err
	}
	return info.Name, nil
}

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.name, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Fatalf("the node refused the registration: %s", s.Error)
	}
	log.Printf("registered with the node")
	return &registerapi.RegistrationStatusResponse{}, nil
}
