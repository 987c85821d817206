package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cairn-os/cairn/internal/controlplane"
	"github.com/cairn-os/cairn/qemu"
)

// external prepares the existing cluster of the kubeconfig at path for the
// nodes to join it: a bootstrap token of their own and what
// controlplane.PrepareForNodes makes. The nodes reach its API server
// through QEMU's user networking: one on the host's loopback at
// qemu.HostAddress, whose serving certificate must name that address.
// Its API server reaches the nodes' InternalIPs only from inside the
// cluster's network namespace, so kubectl logs and exec do not reach
// them.
func external(path string) (*apiServer, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	}
	if len(ca) == 0 {
		return nil, fmt.Errorf("kubeconfig %s names no CA of the API server: the nodes need it to trust the server", path)
	}
	forNodes, err := nodeURL(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	token, err := controlplane.NewBootstrapToken()
	if err != nil {
		return nil, err
	}
	if err := controlplane.PrepareForNodes(cs, token, cfg.Host, ca); err != nil {
		return nil, fmt.Errorf("prepare %s for the nodes: %w", cfg.Host, err)
	}
	return &apiServer{client: cs, server: strings.TrimPrefix(cfg.Host, "https://"), nodeURL: forNodes, caPEM: ca, token: token, external: true}, nil
}

// nodeURL is the API server at server as the nodes reach it: one on the
// host's loopback at qemu.HostAddress, any other where it is.
func nodeURL(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("server %q: want https://HOST[:PORT]", server)
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); host == "localhost" || err == nil && ip.IsLoopback() {
		port := u.Port()
		if port == "" {
			port = "443"
		}
		u.Host = net.JoinHostPort(qemu.HostAddress, port)
	}
	return u.String(), nil
}

// serviceCIDRs are the cluster's Service ranges: its own control plane's,
// or an existing cluster's ServiceCIDR objects.
func (a *apiServer) serviceCIDRs() ([]string, error) {
	if !a.external {
		return []string{DefaultServiceCIDR}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := a.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("the cluster's Service ranges: %w", err)
	}
	var cidrs []string
	for _, sc := range list.Items {
		cidrs = append(cidrs, sc.Spec.CIDRs...)
	}
	return cidrs, nil
}

// leave takes the cluster out of an existing one: its Nodes, its
// bootstrap token and the DNS it deployed there.
func (c *Cluster) leave() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, n := range c.state.Nodes {
		if err := c.api.client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Node %s: %w", n.Name, err))
		}
	}
	errs = append(errs, controlplane.RemoveBootstrapToken(ctx, c.api.client, c.api.token))
	if c.state.DeployedDNS {
		errs = append(errs, c.removeDNS(ctx))
	}
	return errors.Join(errs...)
}
