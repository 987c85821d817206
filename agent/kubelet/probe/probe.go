// Package probe runs a Pod's startup, liveness and readiness probes.
//
// Do runs one probe: exec, httpGet, tcpSocket or grpc, through
// agent/kubelet/handler. A Manager runs one goroutine per running
// container and probe kind, each probing every periodSeconds after
// initialDelaySeconds and turning successThreshold successes or
// failureThreshold failures in a row into the probe's result:
//
//   - startup gates the others: until it succeeds they do not run and
//     the container is neither started nor ready; once it succeeds it
//     stops, and the readiness probe runs at once, not a period later;
//   - readiness is the container's ready;
//   - liveness (and startup) failing stops the container through the CRI,
//     with its grace period, so that the pod worker restarts it as its
//     restartPolicy says, counting the restart.
//
// Sidecars (init containers with restartPolicy Always) are probed as app
// containers are. While a pod is killed only its readiness probes run
// (Terminating), so that its readiness shows as its containers stop. An
// httpGet probe redirected to another host succeeds, with a ProbeWarning
// event.
//
// The verdicts go to a Results cache, which the pod worker reads (Ready,
// Started) and whose Updates channel tells it, by pod, when one changed.
// Verdicts belong to one CRI container: a restarted container starts
// again unready and not started.
package probe

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/handler"
)

// Kind is a probe's kind.
type Kind string

const (
	Startup   Kind = "startup"
	Liveness  Kind = "liveness"
	Readiness Kind = "readiness"
)

// The API's defaults of a probe's timing.
const (
	DefaultPeriod           = 10 * time.Second
	DefaultTimeout          = 1 * time.Second
	DefaultSuccessThreshold = 1
	DefaultFailureThreshold = 3
)

// Do runs probe p once against t within its timeout; nil is success.
func Do(ctx context.Context, rt criv1.RuntimeServiceClient, p *corev1.Probe, t handler.Target) error {
	return handler.Run(ctx, rt, handler.FromProbe(p.ProbeHandler), seconds(p.TimeoutSeconds, DefaultTimeout), t)
}

func seconds(s int32, def time.Duration) time.Duration {
	if s <= 0 {
		return def
	}
	return time.Duration(s) * time.Second
}
