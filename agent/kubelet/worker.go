package kubelet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/kubelet/probe"
	"github.com/cairn-os/cairn/agent/kubelet/volumes"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/machineconfig"
)

// PodConfig is what the node runs its pods with. The pod worker itself
// (pods.Worker) is made from it by New (see newPodWorker); what it reads
// and records through the API, it does with the node's own credentials
// once the node joined.
type PodConfig struct {
	// Runtime and Images are the CRI runtime's services.
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	// LogRoot holds the pods' container logs, /var/log/pods on a node.
	LogRoot string
	// ClusterDNS, if set, is the resolver of ClusterFirst pods.
	ClusterDNS *pods.ClusterDNS

	// volumeClock, if set, is the clock of the pods' volumes (token
	// expiry), which tests move.
	volumeClock func() time.Time
}

// NewPodConfig is the pod config of a node of cluster: it runs the
// node's pods through the CRI client rt and keeps their container logs
// under logRoot (/var/log/pods on a node).
func NewPodConfig(cluster *machineconfig.Cluster, rt *cri.Client, logRoot string) *PodConfig {
	c := &PodConfig{Runtime: rt.Runtime, Images: rt.Images, LogRoot: logRoot}
	if len(cluster.ClusterDNS) > 0 {
		c.ClusterDNS = &pods.ClusterDNS{Servers: cluster.ClusterDNS, Domain: cluster.ClusterDomain}
	}
	return c
}

// newPodWorker makes the one pod worker of the node's pods, static and
// API's alike, from the Pods config: its Refs (the ConfigMaps and Secrets
// the pods refer to, the Services, the Node), Volumes (under Dir/pods)
// and Events (sent as the kubelet sends them, from component "kubelet" on
// this host) use the API once the node joined (see join); results are
// the probes' verdicts, whose startup probes hold sidecars back. The returned
// function, called once the pods' goroutines are done, stops sending
// events.
func (k *Kubelet) newPodWorker(results *probe.Results) (w *pods.Worker, stop func(), err error) {
	pc := k.cfg.Pods
	k.refs = &joinedRefs{}
	k.volumes = &podVolumes{static: &volumes.Manager{Root: k.podsDir(), Now: pc.volumeClock, Node: k.refs.Node, CSI: k.cfg.CSI, Tmpfs: true}}
	b := record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{SpamKeyFunc: spamKey})
	k.events = b
	k.qos = newQOSCgroups(k.log)
	w, err = pods.New(pods.Config{
		Runtime: pc.Runtime, Images: pc.Images, LogRoot: pc.LogRoot, ClusterDNS: pc.ClusterDNS,
		CgroupParent: k.qos.cgroupParent,
		Refs:         k.refs, Started: results.Started, PodsDir: k.podsDir(),
		Volumes: k.volumes, ResizeFits: k.resizeFits,
		Events: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: k.cfg.NodeName}),
		Log:    k.log,
	})
	if err != nil {
		b.Shutdown()
		return nil, nil, err
	}
	return w, b.Shutdown, nil
}

func (k *Kubelet) podsDir() string { return filepath.Join(k.cfg.Dir, "pods") }

// join points the worker at the API through m; the returned function,
// called when the membership's components stop, stops sending events.
func (k *Kubelet) join(m *node.Member) (stop func()) {
	// The Services are watched, all of them, as the kubelet does: every
	// container start needs its namespace's.
	services := m.Informers.Core().V1().Services()
	k.refs.cur.Store(&nodeRefs{client: m.Client, node: m.Node,
		services: services.Lister(), servicesSynced: services.Informer().HasSynced})
	k.volumes.api.Store(&volumes.Manager{Root: k.podsDir(), Client: m.Client, Now: k.cfg.Pods.volumeClock, Node: k.refs.Node, CSI: k.cfg.CSI, Tmpfs: true})
	k.member.Store(m)
	sink := k.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: m.Client.CoreV1().Events("")})
	return sink.Stop
}

// errNotJoined is what the worker's questions about the API get before
// the node joined, when only static pods run: validation keeps them from
// asking most (staticpod.Validate).
var errNotJoined = errors.New("the node has not joined its cluster yet: no API server to ask")

// joinedRefs answers pods.Refs through the member's nodeRefs once the
// node joined.
type joinedRefs struct {
	cur atomic.Pointer[nodeRefs]
}

func (r *joinedRefs) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	if n := r.cur.Load(); n != nil {
		return n.ConfigMap(ctx, namespace, name)
	}
	return nil, fmt.Errorf("ConfigMap %s/%s: %w", namespace, name, errNotJoined)
}

func (r *joinedRefs) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	if n := r.cur.Load(); n != nil {
		return n.Secret(ctx, namespace, name)
	}
	return nil, fmt.Errorf("Secret %s/%s: %w", namespace, name, errNotJoined)
}

// Services are none before the node joined: a static pod then starts
// without the service environment variables, as the kubelet's do when it
// has not listed the Services.
func (r *joinedRefs) Services(ctx context.Context, namespace string) ([]*corev1.Service, error) {
	if n := r.cur.Load(); n != nil {
		return n.Services(ctx, namespace)
	}
	return nil, nil
}

func (r *joinedRefs) Node(ctx context.Context) (*corev1.Node, error) {
	if n := r.cur.Load(); n != nil {
		return n.Node(ctx)
	}
	return nil, fmt.Errorf("the Node: %w", errNotJoined)
}

// podVolumes keeps the static pods' volumes with a manager that has no
// client (they mount nothing from the API: staticpod.Validate)
// and the API pods' with the member's, both under the same directory.
type podVolumes struct {
	static *volumes.Manager
	api    atomic.Pointer[volumes.Manager] // once joined, when API pods come
}

func (v *podVolumes) of(pod *corev1.Pod) (*volumes.Manager, error) {
	if isStatic(pod) {
		return v.static, nil
	}
	if m := v.api.Load(); m != nil {
		return m, nil
	}
	return nil, fmt.Errorf("volumes of pod %s/%s: %w", pod.Namespace, pod.Name, errNotJoined)
}

func (v *podVolumes) Setup(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	m, err := v.of(pod)
	if err != nil {
		return nil, err
	}
	return m.Setup(ctx, pod)
}

func (v *podVolumes) Refresh(ctx context.Context, pod *corev1.Pod) error {
	m, err := v.of(pod)
	if err != nil {
		return err
	}
	return m.Refresh(ctx, pod)
}

// TearDown removes the pod's directory, which both managers share, and
// what either keeps of it in memory.
func (v *podVolumes) TearDown(uid types.UID) error {
	err := v.static.TearDown(uid)
	if m := v.api.Load(); m != nil {
		err = errors.Join(err, m.TearDown(uid))
	}
	return err
}

func (v *podVolumes) Pods() ([]types.UID, error) { return v.static.Pods() }
