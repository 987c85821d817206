package kubelet

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

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
