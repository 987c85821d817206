package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// listingRuntime answers the lists from its containers (all running) and
// counts them; ExecSync succeeds only for the IDs in runs.
type listingRuntime struct {
	criv1.RuntimeServiceClient
	containers []*criv1.Container
	runs       map[string]bool
	lists      int
	execs      []string
}

func (f *listingRuntime) ListContainers(_ context.Context, req *criv1.ListContainersRequest, _ ...grpc.CallOption) (*criv1.ListContainersResponse, error) {
	f.lists++
	var out []*criv1.Container
	for _, c := range f.containers {
		if sel := req.GetFilter().GetLabelSelector(); sel != nil && (c.Labels[pods.LabelPodUID] != sel[pods.LabelPodUID] || c.Labels[pods.LabelContainerName] != sel[pods.LabelContainerName]) {
			continue
		}
		out = append(out, c)
	}
	return &criv1.ListContainersResponse{Containers: out}, nil
}

func (f *listingRuntime) ListPodSandbox(context.Context, *criv1.ListPodSandboxRequest, ...grpc.CallOption) (*criv1.ListPodSandboxResponse, error) {
	return &criv1.ListPodSandboxResponse{}, nil
}

func (f *listingRuntime) ExecSync(_ context.Context, req *criv1.ExecSyncRequest, _ ...grpc.CallOption) (*criv1.ExecSyncResponse, error) {
	f.execs = append(f.execs, req.ContainerId)
	if !f.runs[req.ContainerId] {
		return nil, errors.New("container is in CONTAINER_EXITED state")
	}
	return &criv1.ExecSyncResponse{Stdout: []byte(req.ContainerId)}, nil
}

func runtimeContainer(id string, attempt uint32) *criv1.Container {
	return &criv1.Container{Id: id, Metadata: &criv1.ContainerMetadata{Name: "app", Attempt: attempt},
		Labels: map[string]string{pods.LabelPodUID: "uid-1", pods.LabelContainerName: "app"}}
}

// TestTargetsCache: streams within targetsTTL find their container in one
// list; one whose cached container stopped since reaches the container
// that replaced it; one whose container is the one the runtime refuses
// gets the runtime's error, the command run once.
func TestTargetsCache(t *testing.T) {
	rt := &listingRuntime{containers: []*criv1.Container{runtimeContainer("first", 0)}, runs: map[string]bool{"first": true}}
	indexer := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	indexer.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "app", UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}})
	now := time.Unix(1000, 0)
	s := &server{cfg: Config{Runtime: rt, Pods: corelisters.NewPodLister(indexer)}, targets: newTargets(rt)}
	s.targets.now = func() time.Time { return now }
	mux := http.NewServeMux()
	mux.HandleFunc("GET /run/{namespace}/{pod}/{container}", s.run)
	run := func() (int, string) {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", "/run/ns/app/app?cmd=true", nil))
		return w.Code, w.Body.String()
	}

	for range 3 {
		if code, body := run(); code != http.StatusOK || body != "first" {
			t.Fatalf("run = %d %q, want 200 from the container first", code, body)
		}
	}
	if rt.lists != 1 {
		t.Errorf("3 runs within %v listed the runtime %d times, want 1", targetsTTL, rt.lists)
	}

	// The container restarted: the cache still names first.
	rt.containers = []*criv1.Container{runtimeContainer("first", 0), runtimeContainer("second", 1)}
	rt.runs = map[string]bool{"second": true}
	rt.execs = nil
	if code, body := run(); code != http.StatusOK || body != "second" {
		t.Errorf("run after a restart = %d %q, want 200 from the container second", code, body)
	}
	if want := []string{"first", "second"}; !slices.Equal(rt.execs, want) {
		t.Errorf("runs went to %q, want %q", rt.execs, want)
	}

	// Stopped for good: the runtime's error, once per container.
	rt.runs = map[string]bool{}
	rt.execs = nil
	now = now.Add(targetsTTL)
	rt.containers = []*criv1.Container{runtimeContainer("second", 1)}
	if code, body := run(); code != http.StatusInternalServerError || body != "run in the container: container is in CONTAINER_EXITED state\n" {
		t.Errorf("run in a stopped container = %d %q, want 500 with the runtime's error", code, body)
	}
	if want := []string{"second"}; !slices.Equal(rt.execs, want) {
		t.Errorf("runs went to %q, want %q", rt.execs, want)
	}
}
