package pods

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Status is what the runtime holds for a pod, as the worker last saw it.
type Status struct {
	Phase     corev1.PodPhase
	SandboxID string
	// PodIP is the sandbox's primary IP; empty on the host network.
	PodIP          string
	InitContainers []ContainerStatus
	Containers     []ContainerStatus
	// EphemeralContainers, added to the running pod (kubectl debug),
	// run once and count for nothing but their own status.
	EphemeralContainers []ContainerStatus
	// ResizePending, if set, says why the node does not resize the pod
	// yet (resize.go).
	ResizePending *ResizePending
	// ResizeError, if not empty, says why a resize the node admitted
	// could not be applied: it is still in progress.
	ResizeError string
}

// RetryAt is when the first container waiting out a backoff may start:
// the pod is worth syncing again then. Zero if none waits.
func (s *Status) RetryAt() time.Time {
	var at time.Time
	for _, cs := range slices.Concat(s.InitContainers, s.Containers) {
		if t := cs.BackoffUntil; !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	return at
}

// capMessages cuts the messages of the terminated containers to an equal
// share each of what a pod may hold (maxPodMessages), as the kubelet does.
func (s *Status) capMessages() {
	n := len(s.InitContainers) + len(s.Containers) + len(s.EphemeralContainers)
	if n == 0 {
		return
	}
	share := maxPodMessages / n
	for _, css := range [][]ContainerStatus{s.InitContainers, s.Containers, s.EphemeralContainers} {
		for i := range css {
			if cs := &css[i]; cs.State == Terminated && len(cs.Message) > share {
				cs.Message = cs.Message[:share]
			}
		}
	}
}

// State is a container's state, the API's three.
type State string

const (
	Waiting    State = "Waiting"
	Running    State = "Running"
	Terminated State = "Terminated"
)

// Reasons for a container waiting, the kubelet's words.
const (
	ReasonPodInitializing   = "PodInitializing"
	ReasonContainerCreating = "ContainerCreating"
	ReasonCrashLoopBackOff  = "CrashLoopBackOff"
)

// ContainerStatus is one container of the pod: its latest CRI container.
type ContainerStatus struct {
	Name string
	// ID is the runtime's ID of the latest container, empty if none was
	// made.
	ID    string
	State State
	// Reason says why it waits or how it ended (Completed, Error,
	// OOMKilled).
	Reason string
	// Message tells more, for a person: why it could not start, or
	// what the runtime said of its end.
	Message      string
	ExitCode     int32
	RestartCount int32
	Image        string
	ImageID      string
	StartedAt    time.Time
	FinishedAt   time.Time
	// LogPath is the absolute path of the latest container's log file.
	LogPath string
	// Resources, for a running container, are the requests and limits
	// applied to it: the spec's once a resize is done.
	Resources *corev1.ResourceRequirements
	// BackoffUntil, if not zero, is when the container, waiting out a
	// backoff, may start.
	BackoffUntil time.Time
}

// containerStatus describes the latest CRI container of a pod container
// (nil if none yet) with the restarts before it.
func containerStatus(name string, cs *criv1.ContainerStatus) ContainerStatus {
	out := ContainerStatus{Name: name, State: Waiting, Reason: ReasonContainerCreating}
	if cs == nil {
		return out
	}
	out.ID = cs.Id
	out.RestartCount = int32(cs.GetMetadata().GetAttempt())
	out.Image = cs.GetImage().GetImage()
	out.ImageID = cs.ImageRef
	out.LogPath = cs.LogPath
	out.StartedAt = unixNano(cs.StartedAt)
	out.FinishedAt = unixNano(cs.FinishedAt)
	out.Message = cs.Message
	switch cs.State {
	case criv1.ContainerState_CONTAINER_RUNNING:
		out.State, out.Reason = Running, ""
	case criv1.ContainerState_CONTAINER_EXITED:
		out.State, out.ExitCode, out.Reason = Terminated, cs.ExitCode, cs.Reason
		if out.Reason == "" {
			out.Reason = "Error"
			if cs.ExitCode == 0 {
				out.Reason = "Completed"
			}
		}
		// What the container left is told after what the runtime said.
		if msg := terminationMessage(cs); msg != "" {
			if out.Message != "" {
				out.Message += ": "
			}
			out.Message += msg
		}
	case criv1.ContainerState_CONTAINER_UNKNOWN:
		out.Reason = "Unknown"
	}
	return out
}

// phase sums the containers up as the pod's phase. Init containers that
// have not all completed keep the pod Pending, or make it Failed when one
// failed for good; then the pod runs while any app container runs or will
// restart, and ends Succeeded or Failed when all have ended for good.
// Sidecars do not count: one that has not started holds the containers
// after it back, which keeps the pod Pending.
func phase(pod *corev1.Pod, inits, apps []ContainerStatus) corev1.PodPhase {
	initPolicy := initRestartPolicy(pod.Spec.RestartPolicy)
	for i, c := range inits {
		if isSidecar(&pod.Spec.InitContainers[i]) {
			continue
		}
		if c.State == Terminated && c.ExitCode != 0 && !Restarts(initPolicy, c.ExitCode) {
			return corev1.PodFailed
		}
		if c.State != Terminated || c.ExitCode != 0 {
			return corev1.PodPending
		}
	}
	var running, waiting, failed, ended int
	for _, c := range apps {
		switch {
		case c.State == Running:
			running++
		case c.State == Terminated && !Restarts(pod.Spec.RestartPolicy, c.ExitCode):
			ended++
			if c.ExitCode != 0 {
				failed++
			}
		case c.State == Waiting && c.ID == "":
			waiting++ // never made
		default:
			running++ // exited, to restart
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case failed > 0:
		return corev1.PodFailed
	case ended == len(apps):
		return corev1.PodSucceeded
	}
	return corev1.PodPending
}

// initRestartPolicy is how init containers restart: a completed one never
// runs again, so Always means OnFailure.
func initRestartPolicy(p corev1.RestartPolicy) corev1.RestartPolicy {
	if p == corev1.RestartPolicyNever {
		return p
	}
	return corev1.RestartPolicyOnFailure
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
