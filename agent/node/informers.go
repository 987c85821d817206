package node

import (
	"context"
	"errors"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cairn-os/cairn/internal/backoff"
)

// The agent's informers list and watch with a patience of their own: they
// wait for an API server that is away instead of failing. client-go's
// reflector backs off after each failure, up to a minute, so after an
// outage the node would otherwise see new and deleted pods, Services and
// endpoints only a minute or more late.

// apiRetry is how often a list or watch is tried again while the API
// server is away.
const apiRetry = time.Second

// NewInformers returns the informer factory of the node nodeName that
// client reads as: in it, the Pods bound to the node, the Services, the
// EndpointSlices and the node's own Node are patient informers (see
// above), which its typed accessors return, e.g.
// f.Core().V1().Pods(). Other kinds it gives are client-go's usual ones:
// register a patient one here first. The factory is not started.
func NewInformers(client kubernetes.Interface, nodeName string) informers.SharedInformerFactory {
	f := informers.NewSharedInformerFactory(client, 0)
	f.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		pods := c.CoreV1().Pods(metav1.NamespaceAll)
		// The Node authorizer lets a node list and watch only its own pods.
		sel := fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		return patientInformer(&corev1.Pod{}, sel, pods.List, pods.Watch)
	})
	f.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		services := c.CoreV1().Services(metav1.NamespaceAll)
		return patientInformer(&corev1.Service{}, "", services.List, services.Watch)
	})
	f.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		slices := c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
		return patientInformer(&discoveryv1.EndpointSlice{}, "", slices.List, slices.Watch)
	})
	f.InformerFor(&corev1.Node{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
		nodes := c.CoreV1().Nodes()
		sel := fields.OneTermEqualSelector("metadata.name", nodeName).String()
		return patientInformer(&corev1.Node{}, sel, nodes.List, nodes.Watch)
	})
	return f
}

// NodesInformer returns a patient informer (see above) of every Node of
// the cluster, for what routes to the other nodes. The caller runs it.
func NodesInformer(client kubernetes.Interface) cache.SharedIndexInformer {
	nodes := client.CoreV1().Nodes()
	return patientInformer(&corev1.Node{}, "", nodes.List, nodes.Watch)
}

// PolicyInformers return patient informers (see above) of what
// NetworkPolicy enforcement reads: every NetworkPolicy, Pod and Namespace
// of the cluster. The caller runs them. The node may read them only if
// the cluster lets it (docs/machine-config.md).
func PolicyInformers(client kubernetes.Interface) (policies, pods, namespaces cache.SharedIndexInformer) {
	np := client.NetworkingV1().NetworkPolicies(metav1.NamespaceAll)
	po := client.CoreV1().Pods(metav1.NamespaceAll)
	ns := client.CoreV1().Namespaces()
	return patientInformer(&networkingv1.NetworkPolicy{}, "", np.List, np.Watch),
		patientInformer(&corev1.Pod{}, "", po.List, po.Watch),
		patientInformer(&corev1.Namespace{}, "", ns.List, ns.Watch)
}

// patientInformer is an informer of the objects like obj that list and
// watch return, selected by the field selector sel, whose list and watch
// wait for the API server while it is away.
func patientInformer[L runtime.Object](obj runtime.Object, sel string,
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return untilReachable(ctx, func(ctx context.Context) (L, error) { return list(ctx, o) })
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return untilReachable(ctx, func(ctx context.Context) (watch.Interface, error) { return watchFn(ctx, o) })
		},
	}
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := inf.SetTransform(dropManagedFields); err != nil {
		panic(err) // only once the informer has started
	}
	return inf
}

// untilReachable calls f until it returns anything but an error that
// says the API server is away or overloaded, or ctx ends.
func untilReachable[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	for {
		v, err := f(ctx)
		if err == nil || !unreachable(err) || backoff.Sleep(ctx, backoff.RealClock, apiRetry) != nil {
			return v, err
		}
	}
}

// unreachable says whether err means the API server could not be reached
// or could not serve for now.
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
}

// dropManagedFields leaves server-side apply's record of who set which
// field out of the cached copy: the node never reads it, and in a small
// object like a Service or an EndpointSlice it is a large part of the
// memory the informers hold.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
