package pods

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/internal/crilog"
)

// Labels the worker sets on sandboxes and containers, the kubelet's names,
// so that tools such as crictl show them as they show the kubelet's.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
)

// sandboxConfig is the CRI sandbox of pod, attempt counting the sandboxes
// made for it before.
func (w *Worker) sandboxConfig(pod *corev1.Pod, attempt uint32) *criv1.PodSandboxConfig {
	labels := map[string]string{}
	for k, v := range pod.Labels {
		labels[k] = v
	}
	labels[LabelPodName] = pod.Name
	labels[LabelPodNamespace] = pod.Namespace
	labels[LabelPodUID] = string(pod.UID)

	network := criv1.NamespaceMode_POD
	if pod.Spec.HostNetwork {
		network = criv1.NamespaceMode_NODE
	}
	pid := criv1.NamespaceMode_CONTAINER
	if pod.Spec.HostPID {
		pid = criv1.NamespaceMode_NODE
	} else if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		pid = criv1.NamespaceMode_POD
	}
	ipc := criv1.NamespaceMode_POD
	if pod.Spec.HostIPC {
		ipc = criv1.NamespaceMode_NODE
	}

	cfg := &criv1.PodSandboxConfig{
		Metadata: &criv1.PodSandboxMetadata{
			Name:      pod.Name,
			Namespace: pod.Namespace,
			Uid:       string(pod.UID),
			Attempt:   attempt,
		},
		Hostname:     w.kernelHostname(pod),
		LogDirectory: w.podLogDir(pod),
		DnsConfig:    w.dnsConfig(pod),
		PortMappings: portMappings(pod),
		Labels:       labels,
		Annotations:  pod.Annotations,
		Linux: &criv1.LinuxPodSandboxConfig{
			CgroupParent: w.cgroupParent(pod),
			SecurityContext: &criv1.LinuxSandboxSecurityContext{
				NamespaceOptions: &criv1.NamespaceOption{Network: network, Pid: pid, Ipc: ipc},
				// The runtime lets only a privileged sandbox hold
				// privileged containers.
				Privileged: anyPrivileged(pod),
			},
		},
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			cfg.Linux.SecurityContext.RunAsUser = &criv1.Int64Value{Value: *sc.RunAsUser}
		}
		if sc.RunAsGroup != nil {
			cfg.Linux.SecurityContext.RunAsGroup = &criv1.Int64Value{Value: *sc.RunAsGroup}
		}
		cfg.Linux.SecurityContext.SupplementalGroups = sc.SupplementalGroups
		cfg.Linux.Sysctls = sysctls(pod)
	}
	return cfg
}

// kernelHostname is the pod's hostname in its UTS namespace: its
// hostname, or its FQDN with setHostnameAsFQDN; none on the host network,
// where the pod has no UTS namespace of its own and the runtime refuses
// one.
func (w *Worker) kernelHostname(pod *corev1.Pod) string {
	if pod.Spec.HostNetwork {
		return ""
	}
	host, domain := w.podHostname(pod)
	if fqdn := pod.Spec.SetHostnameAsFQDN; fqdn != nil && *fqdn && domain != "" {
		// Longer than the kernel's 64 bytes, the runtime refuses it
		// and the sandbox fails, as with the kubelet.
		return host + "." + domain
	}
	return host
}

// podHostname is the pod's hostname and, if it has a subdomain and the
// node knows the cluster's domain, its domain, as the kubelet makes them:
// hostnameOverride if set (and then no domain), else its hostname, else
// its name, cut to a DNS label's 63 characters.
func (w *Worker) podHostname(pod *corev1.Pod) (host, domain string) {
	host = pod.Name
	switch {
	case pod.Spec.HostnameOverride != nil:
		host = *pod.Spec.HostnameOverride
	case pod.Spec.Hostname != "":
		host = pod.Spec.Hostname
	}
	if len(host) > 63 {
		host = strings.TrimRight(host[:63], "-.")
	}
	if pod.Spec.HostnameOverride == nil && pod.Spec.Subdomain != "" && w.cfg.ClusterDNS != nil && w.cfg.ClusterDNS.Domain != "" {
		domain = pod.Spec.Subdomain + "." + pod.Namespace + ".svc." + w.cfg.ClusterDNS.Domain
	}
	return host, domain
}

// podLogDir is where the runtime writes the pod's container logs, in the
// kubelet's layout that the node API reads them from.
func (w *Worker) podLogDir(pod *corev1.Pod) string {
	return crilog.PodDir(w.cfg.LogRoot, pod.Namespace, pod.Name, string(pod.UID))
}

// dnsConfig is the pod's resolv.conf by its dnsPolicy: the cluster's DNS
// for ClusterFirst (the host's when the worker has none, or on the host
// network without ClusterFirstWithHostNet), the host's for Default (nil:
// the runtime copies it), only the pod's dnsConfig for None; the pod's
// dnsConfig is appended in every case.
func (w *Worker) dnsConfig(pod *corev1.Pod) *criv1.DNSConfig {
	var cfg *criv1.DNSConfig
	cluster := w.cfg.ClusterDNS != nil && len(w.cfg.ClusterDNS.Servers) > 0
	switch pod.Spec.DNSPolicy {
	case corev1.DNSDefault:
	case corev1.DNSNone:
		cfg = &criv1.DNSConfig{}
	case corev1.DNSClusterFirstWithHostNet:
		if cluster {
			cfg = w.clusterDNS(pod)
		}
	default: // ClusterFirst
		if cluster && !pod.Spec.HostNetwork {
			cfg = w.clusterDNS(pod)
		}
	}
	if pc := pod.Spec.DNSConfig; pc != nil {
		if cfg == nil {
			cfg = &criv1.DNSConfig{}
		}
		cfg.Servers = append(cfg.Servers, pc.Nameservers...)
		cfg.Searches = append(cfg.Searches, pc.Searches...)
		for _, o := range pc.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			cfg.Options = append(cfg.Options, opt)
		}
	}
	return cfg
}

func (w *Worker) clusterDNS(pod *corev1.Pod) *criv1.DNSConfig {
	d := w.cfg.ClusterDNS.Domain
	return &criv1.DNSConfig{
		Servers:  append([]string(nil), w.cfg.ClusterDNS.Servers...),
		Searches: []string{pod.Namespace + ".svc." + d, "svc." + d, d},
		Options:  []string{"ndots:5"},
	}
}

// portMappings are the container ports published on the node (hostPort).
func portMappings(pod *corev1.Pod) []*criv1.PortMapping {
	var out []*criv1.PortMapping
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == 0 {
				continue
			}
			proto := criv1.Protocol_TCP
			switch p.Protocol {
			case corev1.ProtocolUDP:
				proto = criv1.Protocol_UDP
			case corev1.ProtocolSCTP:
				proto = criv1.Protocol_SCTP
			}
			out = append(out, &criv1.PortMapping{
				Protocol:      proto,
				ContainerPort: p.ContainerPort,
				HostPort:      p.HostPort,
				HostIp:        p.HostIP,
			})
		}
	}
	return out
}

func anyPrivileged(pod *corev1.Pod) bool {
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			return true
		}
	}
	return false
}
