package kubelet

import (
	"context"
	"errors"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The node's pods come from an informer whose list and watch wait for an
// API server that is away instead of failing: client-go's reflector backs
// off after each failure, up to a minute, so after an outage the node
// would otherwise see new and deleted pods only a minute or more late.

// apiRetry is how often a list or watch is tried again while the API
// server is away.
const apiRetry = time.Second

// podInformer is an informer of the Pods bound to node.
func podInformer(client kubernetes.Interface, node string) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return untilReachable(ctx, func(ctx context.Context) (*corev1.PodList, error) { return pods.List(ctx, o) })
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return untilReachable(ctx, func(ctx context.Context) (watch.Interface, error) { return pods.Watch(ctx, o) })
		},
	}
	return cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
}

// untilReachable calls f until it returns anything but an error that
// says the API server is away or overloaded, or ctx ends.
func untilReachable[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	for {
		v, err := f(ctx)
		if err == nil || !unreachable(err) || !sleep(ctx, apiRetry) {
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
