package kubelet

import (
	"context"
	"errors"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/kubelet/probe"
	"github.com/cairn-os/cairn/agent/kubelet/volumes"
)

// newPodWorker makes the pod worker of the node's Pods config with what
// it reads and records through the API with the node's own credentials:
// Refs (the ConfigMaps and Secrets the node's pods refer to, and the
// Node), Volumes (under Dir/pods) and Events (sent as the kubelet sends
// them, from component "kubelet" on this host); results are the probes'
// verdicts, whose startup probes hold sidecars back. The returned
// function, called once the pods' goroutines are done, stops sending
// events.
func (k *kubelet) newPodWorker(results *probe.Results) (w *pods.Worker, stop func(), err error) {
	pc := k.cfg.Pods
	// The Services are watched, all of them, as the kubelet does: every
	// container start needs its namespace's.
	services := k.member.Informers.Core().V1().Services()
	refs := &nodeRefs{client: k.client, node: k.member.Node,
		services: services.Lister(), servicesSynced: services.Informer().HasSynced}
	b := record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{SpamKeyFunc: spamKey})
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.client.CoreV1().Events("")})
	w, err = pods.New(pods.Config{
		Runtime: pc.Runtime, Images: pc.Images, LogRoot: pc.LogRoot, ClusterDNS: pc.ClusterDNS,
		Refs: refs, Started: results.Started,
		Volumes: &volumes.Manager{Root: filepath.Join(k.cfg.Dir, "pods"), Client: k.client, Now: pc.volumeClock, Node: refs.Node},
		Events:  b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: k.member.Name}),
		Log:     k.log,
	})
	if err != nil {
		b.Shutdown()
		return nil, nil, err
	}
	return w, b.Shutdown, nil
}

// spamKey groups the events the broadcaster rate-limits: the same event
// about the same container, such as a Failed repeated on every retry, and
// not, as by default, every event about a pod, so that a pod that failed
// for a while still tells when it started.
func spamKey(e *corev1.Event) string {
	o := e.InvolvedObject
	return e.Source.Component + "/" + e.Source.Host + "/" + o.Kind + "/" + o.Namespace + "/" + o.Name + "/" + string(o.UID) + "/" +
		o.FieldPath + "/" + e.Type + "/" + e.Reason + "/" + e.Message
}

// nodeRefs answers pods.Refs with the node's client, which the Node
// authorizer lets read only the ConfigMaps and Secrets of the node's pods.
type nodeRefs struct {
	client         kubernetes.Interface
	node           func() *corev1.Node // the member's, as watched
	services       corelisters.ServiceLister
	servicesSynced cache.InformerSynced
}

func (r *nodeRefs) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	return r.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (r *nodeRefs) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	return r.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (r *nodeRefs) Services(ctx context.Context, namespace string) ([]*corev1.Service, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), r.servicesSynced) {
		return nil, errors.New("the Services are not listed yet")
	}
	return r.services.Services(namespace).List(labels.Everything())
}

// Node is the Node as the member last watched it: no call to the API
// server, so a container that needs it starts while the API server is away.
func (r *nodeRefs) Node(context.Context) (*corev1.Node, error) {
	return r.node(), nil
}
