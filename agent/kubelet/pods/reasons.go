package pods

import (
	"errors"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Why a container could not start, the kubelet's reasons: each is the
// container's waiting reason on the Pod. Sync's errors wrap them, so that
// errors.Is tells them apart.
var (
	ErrInvalidImageName      = errors.New("InvalidImageName")
	ErrImageInspect          = errors.New("ImageInspectError")
	ErrImageNeverPull        = errors.New("ErrImageNeverPull")
	ErrImagePull             = errors.New("ErrImagePull")
	ErrImagePullBackOff      = errors.New("ImagePullBackOff")
	ErrCreateContainerConfig = errors.New("CreateContainerConfigError")
	ErrCreateContainer       = errors.New("CreateContainerError")
	ErrRunContainer          = errors.New("RunContainerError")
)

// waitError is why a container waits: reason, one of the errors above,
// and msg, the waiting state's message.
type waitError struct {
	reason error
	msg    string
}

func (e *waitError) Error() string { return e.reason.Error() + ": " + e.msg }
func (e *waitError) Unwrap() error { return e.reason }

// criMessage is what a CRI call's error says, without the gRPC code.
func criMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// Events records what happens to pods as Kubernetes Events, as the
// kubelet does; client-go's record.EventRecorder is one.
type Events interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Event records an event about the container named name of pod, or about
// the pod when name is empty, if the worker has Events.
func (w *Worker) Event(pod *corev1.Pod, name, eventtype, reason, format string, args ...any) {
	if w.cfg.Events == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	if name != "" {
		ref.FieldPath = "spec.containers{" + name + "}"
		for _, c := range pod.Spec.InitContainers {
			if c.Name == name {
				ref.FieldPath = "spec.initContainers{" + name + "}"
			}
		}
	}
	w.cfg.Events.Eventf(ref, eventtype, reason, format, args...)
}

// backoffKey names a container of a pod, for toldBackoff.
type backoffKey struct {
	uid  types.UID
	name string
}

// forget drops what the worker remembers of pod: its failed pulls and
// the backoffs it told.
func (w *Worker) forget(pod *corev1.Pod) {
	w.pulls.Range(func(k, _ any) bool {
		if k.(pullKey).uid == pod.UID {
			w.pulls.Delete(k)
		}
		return true
	})
	w.toldBackoff.Range(func(k, _ any) bool {
		if k.(backoffKey).uid == pod.UID {
			w.toldBackoff.Delete(k)
		}
		return true
	})
}
