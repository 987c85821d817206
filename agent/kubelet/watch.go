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

// The node's pods and the Services come from informers whose list and
// watch wait for an API server that is away instead of failing:
// client-go's reflector backs off after each failure, up to a minute, so
// after an outage the node would otherwise see new and deleted pods only a
// minute or more late.

// apiRetry is how often a list or watch is tried again while the API
// server is away.
const apiRetry = time.Second

// podInformer is an informer of the Pods bound to node.
func podInformer(client kubernetes.Interface, node string) cache.SharedIndexInformer {
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	return patientInformer(&corev1.Pod{}, sel, pods.List, pods.Watch)
}

// serviceInformer is an informer of every Service.
func serviceInformer(client kubernetes.Interface) cache.SharedIndexInformer {
	services := client.CoreV1().Services(metav1.NamespaceAll)
	return patientInformer(&corev1.Service{}, "", services.List, services.Watch)
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
	return cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
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
