package pods

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestResources(t *testing.T) {
	q := resource.MustParse
	for _, tc := range []struct {
		name string
		in   corev1.ResourceRequirements
		want *criv1.LinuxContainerResources
	}{
		{"none: minimum shares, no quota", corev1.ResourceRequirements{}, &criv1.LinuxContainerResources{CpuShares: 2}},
		{"request 250m: 256 shares", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("250m")},
		}, &criv1.LinuxContainerResources{CpuShares: 256}},
		{"limit 1.5 CPU and 128Mi", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("1")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("1500m"), corev1.ResourceMemory: q("128Mi")},
		}, &criv1.LinuxContainerResources{CpuShares: 1024, CpuPeriod: 100000, CpuQuota: 150000, MemoryLimitInBytes: 128 << 20}},
		{"limit alone sets shares too", corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: q("500m")},
		}, &criv1.LinuxContainerResources{CpuShares: 512, CpuPeriod: 100000, CpuQuota: 50000}},
		{"tiny limit gets the minimum quota", corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: q("1m")},
		}, &criv1.LinuxContainerResources{CpuShares: 2, CpuPeriod: 100000, CpuQuota: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, resources(tc.in), protocmp.Transform()); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSecurityContextConfig(t *testing.T) {
	podUser, user, group, yes := int64(10), int64(1000), int64(2000), true
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsUser: &podUser, RunAsGroup: &group}}}
	c := &corev1.Container{SecurityContext: &corev1.SecurityContext{
		RunAsUser: &user, Privileged: &yes, ReadOnlyRootFilesystem: &yes,
		Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}, Drop: []corev1.Capability{"ALL"}},
	}}
	got := securityContext(pod, c, "")
	want := &criv1.LinuxContainerSecurityContext{
		NamespaceOptions: &criv1.NamespaceOption{Network: criv1.NamespaceMode_POD, Pid: criv1.NamespaceMode_CONTAINER, Ipc: criv1.NamespaceMode_POD},
		RunAsUser:        &criv1.Int64Value{Value: 1000}, // the container's wins
		RunAsGroup:       &criv1.Int64Value{Value: 2000}, // the pod's applies
		Privileged:       true,
		ReadonlyRootfs:   true,
		Capabilities:     &criv1.Capability{AddCapabilities: []string{"NET_ADMIN"}, DropCapabilities: []string{"ALL"}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("securityContext (-want +got):\n%s", diff)
	}
}

func TestSandboxConfig(t *testing.T) {
	w := &Worker{cfg: Config{LogRoot: "/var/log/pods", ClusterDNS: &ClusterDNS{Servers: []string{"10.96.0.10"}, Domain: "cluster.local"}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Ports: []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 53, Protocol: corev1.ProtocolUDP}},
		}}},
	}
	got := w.sandboxConfig(pod, 2)
	want := &criv1.PodSandboxConfig{
		Metadata:     &criv1.PodSandboxMetadata{Name: "web", Namespace: "shop", Uid: "u1", Attempt: 2},
		Hostname:     "web",
		LogDirectory: "/var/log/pods/shop_web_u1",
		DnsConfig: &criv1.DNSConfig{
			Servers:  []string{"10.96.0.10"},
			Searches: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local"},
			Options:  []string{"ndots:5"},
		},
		PortMappings: []*criv1.PortMapping{{Protocol: criv1.Protocol_TCP, ContainerPort: 80, HostPort: 8080}},
		Labels:       map[string]string{"app": "web", LabelPodName: "web", LabelPodNamespace: "shop", LabelPodUID: "u1"},
		Linux: &criv1.LinuxPodSandboxConfig{SecurityContext: &criv1.LinuxSandboxSecurityContext{
			NamespaceOptions: &criv1.NamespaceOption{Network: criv1.NamespaceMode_POD, Pid: criv1.NamespaceMode_CONTAINER, Ipc: criv1.NamespaceMode_POD},
		}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("sandboxConfig (-want +got):\n%s", diff)
	}

	// On the host network: no hostname, no cluster DNS, the node's network.
	pod.Spec.HostNetwork = true
	got = w.sandboxConfig(pod, 0)
	if got.Hostname != "" || got.DnsConfig != nil || got.Linux.SecurityContext.NamespaceOptions.Network != criv1.NamespaceMode_NODE {
		t.Errorf("host network sandbox: hostname %q, DNS %v, network %v; want none, nil (the host's), NODE",
			got.Hostname, got.DnsConfig, got.Linux.SecurityContext.NamespaceOptions.Network)
	}
}

func TestPullPolicy(t *testing.T) {
	for image, want := range map[string]corev1.PullPolicy{
		"busybox":                    corev1.PullAlways,
		"busybox:latest":             corev1.PullAlways,
		"busybox:1.36":               corev1.PullIfNotPresent,
		"127.0.0.1:5000/a/b:v1":      corev1.PullIfNotPresent,
		"127.0.0.1:5000/a/b":         corev1.PullAlways,
		"busybox@sha256:" + sha256ID: corev1.PullIfNotPresent,
	} {
		if got := pullPolicy(&corev1.Container{Image: image}); got != want {
			t.Errorf("pullPolicy(%q) = %s, want %s", image, got, want)
		}
	}
	if got := pullPolicy(&corev1.Container{Image: "busybox", ImagePullPolicy: corev1.PullNever}); got != corev1.PullNever {
		t.Errorf("pullPolicy with Never set = %s, want Never", got)
	}
}

const sha256ID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestPhase(t *testing.T) {
	done := ContainerStatus{ID: "x", State: Terminated, ExitCode: 0}
	failed := ContainerStatus{ID: "x", State: Terminated, ExitCode: 1}
	running := ContainerStatus{ID: "x", State: Running}
	unmade := ContainerStatus{State: Waiting}
	for _, tc := range []struct {
		name        string
		policy      corev1.RestartPolicy
		inits, apps []ContainerStatus
		want        corev1.PodPhase
		sidecars    []int // which of inits are sidecars
	}{
		{"init running", corev1.RestartPolicyAlways, []ContainerStatus{running}, []ContainerStatus{unmade}, corev1.PodPending, nil},
		{"init failed, Never", corev1.RestartPolicyNever, []ContainerStatus{failed}, []ContainerStatus{unmade}, corev1.PodFailed, nil},
		{"init failed, will retry", corev1.RestartPolicyAlways, []ContainerStatus{failed}, []ContainerStatus{unmade}, corev1.PodPending, nil},
		{"app running", corev1.RestartPolicyAlways, []ContainerStatus{done}, []ContainerStatus{running}, corev1.PodRunning, nil},
		{"app not made yet", corev1.RestartPolicyAlways, nil, []ContainerStatus{running, unmade}, corev1.PodPending, nil},
		{"all done, Never", corev1.RestartPolicyNever, nil, []ContainerStatus{done, done}, corev1.PodSucceeded, nil},
		{"one failed, Never", corev1.RestartPolicyNever, nil, []ContainerStatus{done, failed}, corev1.PodFailed, nil},
		{"failed, OnFailure restarts", corev1.RestartPolicyOnFailure, nil, []ContainerStatus{failed}, corev1.PodRunning, nil},
		{"done, OnFailure", corev1.RestartPolicyOnFailure, nil, []ContainerStatus{done}, corev1.PodSucceeded, nil},
		{"done, Always restarts", corev1.RestartPolicyAlways, nil, []ContainerStatus{done}, corev1.PodRunning, nil},
		{"sidecar running, app running", corev1.RestartPolicyNever, []ContainerStatus{running}, []ContainerStatus{running}, corev1.PodRunning, []int{0}},
		{"sidecar failed, app running", corev1.RestartPolicyNever, []ContainerStatus{failed}, []ContainerStatus{running}, corev1.PodRunning, []int{0}},
		{"sidecar running, app done, Never", corev1.RestartPolicyNever, []ContainerStatus{running}, []ContainerStatus{done}, corev1.PodSucceeded, []int{0}},
		{"sidecar failed, app done, Never", corev1.RestartPolicyNever, []ContainerStatus{failed}, []ContainerStatus{done}, corev1.PodSucceeded, []int{0}},
		{"sidecar done, app failed, OnFailure", corev1.RestartPolicyOnFailure, []ContainerStatus{done}, []ContainerStatus{failed}, corev1.PodRunning, []int{0}},
		{"sidecar, then init running", corev1.RestartPolicyNever, []ContainerStatus{running, running}, []ContainerStatus{unmade}, corev1.PodPending, []int{0}},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tc.policy, InitContainers: make([]corev1.Container, len(tc.inits))}}
		for _, i := range tc.sidecars {
			pod.Spec.InitContainers[i].RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
		}
		if got := phase(pod, tc.inits, tc.apps); got != tc.want {
			t.Errorf("%s: phase = %s, want %s", tc.name, got, tc.want)
		}
	}
}
