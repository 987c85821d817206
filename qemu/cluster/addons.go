package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/image/build"
	"github.com/cairn-os/cairn/image/oci"
	"github.com/cairn-os/cairn/internal/inns"
)

// RegistryPort is the cluster registry's port on the bridge.
const RegistryPort = 5000

// serveRegistry serves an in-memory registry on the bridge, where the
// nodes pull from it, and on a free port of the host's loopback, where
// users push to it: one store, two addresses.
func (c *Cluster) serveRegistry() error {
	inside := net.JoinHostPort(c.net.host().String(), strconv.Itoa(RegistryPort))
	var bridged net.Listener
	if err := inns.Do(c.state.Netns, func() error {
		var err error
		bridged, err = net.Listen("tcp", inside)
		return err
	}); err != nil {
		return fmt.Errorf("registry on %s: %w", inside, err)
	}
	local, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		bridged.Close()
		return fmt.Errorf("registry on the host's loopback: %w", err)
	}
	quiet := log.New(io.Discard, "", 0)
	c.registry = &http.Server{Handler: ggcrregistry.New(ggcrregistry.Logger(quiet)), ErrorLog: quiet, ReadHeaderTimeout: 10 * time.Second}
	for _, l := range []net.Listener{bridged, local} {
		go c.registry.Serve(l)
	}
	c.state.Registry, c.state.NodeRegistry = local.Addr().String(), inside
	return nil
}

// push pushes the single-binary image of bin (a file) to the cluster's
// registry as repoTag and returns its reference as the nodes name it.
func (c *Cluster) push(ctx context.Context, bin, repoTag string) (string, error) {
	if err := PushBinary(ctx, c.state.Registry, bin, repoTag); err != nil {
		return "", err
	}
	return c.state.NodeRegistry + "/" + repoTag, nil
}

// PushBinary pushes an image whose one layer is the static binary bin (a
// file), as /usr/bin/NAME and the entrypoint, to the registry at addr
// (HOST:PORT, plain HTTP) as repoTag. The same binary makes the same
// image.
func PushBinary(ctx context.Context, addr, bin, repoTag string) error {
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	img, err := oci.BinaryImage(b, "/usr/bin/"+filepath.Base(bin), time.Unix(build.DefaultSourceDateEpoch, 0).UTC())
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(addr+"/"+repoTag, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// DNSServiceIP is the cluster DNS Service's ClusterIP in a cluster with
// its own control plane: the tenth address of DefaultServiceCIDR, as
// kubeadm takes it.
const DNSServiceIP = "10.96.0.10"

// corefile serves the cluster's names and nothing else: no name outside
// it is forwarded, since nothing leaves the cluster's network.
const corefile = `.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
    }
    cache 30
    reload
    loadbalance
}
`

// deployDNS pushes CoreDNS (ControlPlaneBin/coredns) to the cluster's
// registry and deploys it as the cluster's DNS, as kubeadm's CoreDNS
// add-on does: a Deployment in kube-system behind the kube-dns Service,
// at DNSServiceIP with a control plane of the cluster's own, else where
// the API server puts it. An existing cluster that has a kube-dns
// Service keeps its own DNS. State.DNS is the address either way.
func (c *Cluster) deployDNS(ctx context.Context) error {
	const ns, app = metav1.NamespaceSystem, dnsApp
	cs := c.api.client
	if c.api.external {
		svc, err := cs.CoreV1().Services(ns).Get(ctx, dnsService, metav1.GetOptions{})
		if err == nil {
			c.state.DNS = svc.Spec.ClusterIP
			c.opts.Progress("DNS: the cluster's own kube-dns Service at " + c.state.DNS)
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("CoreDNS: %w", err)
		}
	}
	image, err := c.push(ctx, filepath.Join(c.opts.ControlPlaneBin, "coredns"), "cairn/coredns:"+coreDNSTag)
	if err != nil {
		return fmt.Errorf("CoreDNS image: %w (make coredns builds it)", err)
	}
	labels := map[string]string{"k8s-app": "kube-dns"}
	ip := DNSServiceIP
	if c.api.external {
		ip = "" // the cluster's Service range is its own
	}
	c.state.DeployedDNS = true
	objects := []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: app}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: dnsRole},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: dnsRole},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: dnsRole},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: app, Namespace: ns}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: app}, Data: map[string]string{"Corefile": corefile},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: dnsService, Labels: labels},
				Spec: corev1.ServiceSpec{Selector: labels, ClusterIP: ip, Ports: []corev1.ServicePort{
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
				}},
			}, metav1.CreateOptions{})
			if err == nil {
				c.state.DNS = svc.Spec.ClusterIP
			}
			return err
		},
		func() error { return createDNSDeployment(ctx, cs, image, labels) },
	}
	for _, create := range objects {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("CoreDNS: %w", err)
		}
	}
	return nil
}

// Names of what deployDNS makes, as kubeadm names them: dnsService is the
// cluster DNS's Service in kube-system, as the conformance suite knows
// it; dnsApp the Deployment, its ServiceAccount and ConfigMap; dnsRole
// the ClusterRole and its binding.
const (
	dnsService = "kube-dns"
	dnsApp     = "coredns"
	dnsRole    = "system:coredns"
)

// removeDNS deletes what deployDNS made: from an existing cluster, which
// outlives this one.
func (c *Cluster) removeDNS(ctx context.Context) error {
	const ns = metav1.NamespaceSystem
	cs := c.api.client
	var errs []error
	for _, err := range []error{
		cs.AppsV1().Deployments(ns).Delete(ctx, dnsApp, metav1.DeleteOptions{}),
		cs.CoreV1().Services(ns).Delete(ctx, dnsService, metav1.DeleteOptions{}),
		cs.CoreV1().ConfigMaps(ns).Delete(ctx, dnsApp, metav1.DeleteOptions{}),
		cs.CoreV1().ServiceAccounts(ns).Delete(ctx, dnsApp, metav1.DeleteOptions{}),
		cs.RbacV1().ClusterRoleBindings().Delete(ctx, dnsRole, metav1.DeleteOptions{}),
		cs.RbacV1().ClusterRoles().Delete(ctx, dnsRole, metav1.DeleteOptions{}),
	} {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// coreDNSTag is the CoreDNS release that test/cluster/coredns pins.
const coreDNSTag = "v1.15.0"

func createDNSDeployment(ctx context.Context, cs kubernetes.Interface, image string, labels map[string]string) error {
	replicas := int32(1)
	_, err := cs.AppsV1().Deployments(metav1.NamespaceSystem).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: dnsApp, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: dnsApp,
					PriorityClassName:  "system-cluster-critical",
					// Its own names come from the node, not from itself.
					DNSPolicy: corev1.DNSDefault,
					Containers: []corev1.Container{{
						Name: "coredns", Image: image, Args: []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}},
							InitialDelaySeconds: 10, PeriodSeconds: 10},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
							PeriodSeconds: 2},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: dnsApp}},
					}}},
				},
			},
		},
	}, metav1.CreateOptions{})
	return err
}

// waitDNS waits until the cluster's DNS is ready: the kube-dns Service
// has a ready endpoint.
func (c *Cluster) waitDNS(ctx context.Context) error {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		list, err := c.api.client.DiscoveryV1().EndpointSlices(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + dnsService,
		})
		if err == nil {
			for _, s := range list.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("the cluster's DNS is not ready: kubectl -n kube-system describe pods -l k8s-app=kube-dns says why")
		case <-tick.C:
		}
	}
}
