package node

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cairn-os/cairn/test/kube"
)

// TestInformersWaitOutOutage stops the API server for longer than
// client-go's reflector takes to back off to half a minute between
// retries, starts it again, and wants a Service created then to reach the
// shared Service informer within a few seconds: the patient list and
// watch retry every second while the API server is away.
func TestInformersWaitOutOutage(t *testing.T) {
	c := kube.Start(t, kube.Options{})
	client, err := kubernetes.NewForConfig(c.UserConfig("admin", "system:masters"))
	if err != nil {
		t.Fatal(err)
	}
	f := NewInformers(client, "outage-1")
	services := f.Core().V1().Services().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	defer f.Shutdown()
	defer cancel()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), services.HasSynced) {
		t.Fatal("the Service informer did not sync")
	}

	c.StopAPIServer()
	// 0.8 s doubling with jitter: client-go's reflector would now wait up
	// to 30 s before its next try.
	const outage = 35 * time.Second
	time.Sleep(outage)
	c.StartAPIServer()

	seen := make(chan struct{})
	reg, err := services.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		if s, ok := obj.(*corev1.Service); ok && s.Name == "after-outage" {
			close(seen)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer services.RemoveEventHandler(reg)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "after-outage", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	const within = 8 * time.Second
	select {
	case <-seen:
		t.Logf("a Service created after a %v outage seen %v after Create", outage, time.Since(created).Round(time.Millisecond))
	case <-time.After(within):
		t.Fatalf("a Service created after a %v outage not seen by the informer %v after Create", outage, within)
	}
}

// TestInformersDropManagedFields: the API server records who set each
// field of a Service; the informers' cached copy leaves that out. The
// node's client, which they list with, speaks protobuf.
func TestInformersDropManagedFields(t *testing.T) {
	c := kube.Start(t, kube.Options{})
	rc := c.UserConfig("admin", "system:masters")
	ClientSettings(rc)
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got string
	if err := client.CoreV1().RESTClient().Get().Resource("services").Do(ctx).ContentType(&got).Error(); err != nil {
		t.Fatal(err)
	}
	if got != runtime.ContentTypeProtobuf {
		t.Errorf("the API server answered the node's client in %q, want protobuf", got)
	}
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "fields", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{FieldManager: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.ManagedFields) == 0 {
		t.Fatal("the API server recorded no managed fields for the Service")
	}
	f := NewInformers(client, "fields-1")
	defer f.Shutdown() // after cancel, which stops the informers
	defer cancel()
	services := f.Core().V1().Services()
	services.Informer()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), services.Informer().HasSynced) {
		t.Fatal("the Service informer did not sync")
	}
	cached, err := services.Lister().Services("default").Get("fields")
	if err != nil {
		t.Fatal(err)
	}
	if len(cached.ManagedFields) != 0 {
		t.Errorf("the cached Service has %d managed fields entries, want none", len(cached.ManagedFields))
	}
	if cached.Spec.ClusterIP != svc.Spec.ClusterIP || cached.Spec.Ports[0].Port != 80 {
		t.Errorf("the cached Service's spec %+v differs from the API server's %+v", cached.Spec, svc.Spec)
	}
}
