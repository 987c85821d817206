package pods

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Service environment variables, which containers find Services by, and
// by which in-cluster clients find the API server: for the default
// namespace's "kubernetes" Service always, and, unless the pod turns
// enableServiceLinks off, for every Service of the pod's namespace that
// has a cluster IP. For a Service "my-svc" with port 80/TCP named "http":
//
//	MY_SVC_SERVICE_HOST=10.96.0.12
//	MY_SVC_SERVICE_PORT=80
//	MY_SVC_SERVICE_PORT_HTTP=80
//	MY_SVC_PORT=tcp://10.96.0.12:80
//	MY_SVC_PORT_80_TCP=tcp://10.96.0.12:80
//	MY_SVC_PORT_80_TCP_PROTO=tcp
//	MY_SVC_PORT_80_TCP_PORT=80
//	MY_SVC_PORT_80_TCP_ADDR=10.96.0.12
//
// They come first: the container's env and envFrom can use them in
// $(VAR) references, and override them.

// masterServiceName is the API server's Service, in the default
// namespace.
const masterServiceName = "kubernetes"

// serviceEnv sets the service variables of the pod's namespace.
func (b *envBuilder) serviceEnv(ctx context.Context) error {
	if b.refs == nil {
		return nil
	}
	links := b.pod.Spec.EnableServiceLinks == nil || *b.pod.Spec.EnableServiceLinks
	var services []*corev1.Service
	if links {
		svcs, err := b.refs.Services(ctx, b.pod.Namespace)
		if err != nil {
			return fmt.Errorf("services of namespace %s for the environment: %w", b.pod.Namespace, err)
		}
		services = svcs
	}
	if !links || b.pod.Namespace != metav1.NamespaceDefault {
		svcs, err := b.refs.Services(ctx, metav1.NamespaceDefault)
		if err != nil {
			return fmt.Errorf("the API server's Service for the environment: %w", err)
		}
		for _, s := range svcs {
			if s.Name == masterServiceName {
				services = append(services, s)
			}
		}
	}
	for _, s := range services {
		if !hasClusterIP(s) {
			continue
		}
		for _, kv := range serviceVars(s) {
			b.set(kv[0], kv[1])
		}
	}
	return nil
}

func hasClusterIP(s *corev1.Service) bool {
	ip := s.Spec.ClusterIP
	return ip != "" && ip != corev1.ClusterIPNone
}

// serviceVars are the variables of one Service, in the order the
// kubelet makes them.
func serviceVars(s *corev1.Service) [][2]string {
	name := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
	ip := s.Spec.ClusterIP
	var out [][2]string
	add := func(k, v string) { out = append(out, [2]string{k, v}) }
	add(name+"_SERVICE_HOST", ip)
	if len(s.Spec.Ports) == 0 {
		return out
	}
	add(name+"_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port)))
	for _, p := range s.Spec.Ports {
		if p.Name != "" {
			add(name+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_")), strconv.Itoa(int(p.Port)))
		}
	}
	first := s.Spec.Ports[0]
	add(name+"_PORT", linkURL(first, ip))
	for _, p := range s.Spec.Ports {
		proto := strings.ToUpper(string(p.Protocol))
		prefix := name + "_PORT_" + strconv.Itoa(int(p.Port)) + "_" + proto
		add(prefix, linkURL(p, ip))
		add(prefix+"_PROTO", strings.ToLower(proto))
		add(prefix+"_PORT", strconv.Itoa(int(p.Port)))
		add(prefix+"_ADDR", ip)
	}
	return out
}

func linkURL(p corev1.ServicePort, ip string) string {
	return strings.ToLower(string(p.Protocol)) + "://" + net.JoinHostPort(ip, strconv.Itoa(int(p.Port)))
}
