package kubelet

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/internal/crilog"
	"github.com/cairn-os/cairn/test/poll"
)

// The probes' patterns: probee answers the n-th request to /script/P as
// the n-th letter of P says (s 200, f 500, t 200 after 3 s), and logs it.
const (
	// readinessScript, with successThreshold 2 and failureThreshold 3,
	// makes the container ready at request 5 (the first two successes in
	// a row), unready at 11 (the first three failures in a row, the
	// slow answers at 7 and 10 counting as failures with timeoutSeconds
	// 1) and ready again at 15.
	readinessScript = "fsfssftsftfsfss"
	// livenessScript, with failureThreshold 3, has the container stopped
	// after request 9, the first three failures in a row.
	livenessScript = "sfsffsfff"
)

// testProbes runs two pods whose containers record what their probes
// asked and when, and checks that against what the node reported in the
// Pods' status, version by version, as the API defines the probes.
func (e *podEnv) testProbes(t *testing.T, spy *criSpy) {
	grace := int64(1)
	httpGet := func(path string, port int32) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port)}}
	}
	exec := func(args ...string) corev1.ProbeHandler {
		return corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: append([]string{"/usr/bin/probee"}, args...)}}
	}
	env := func(kv ...string) []corev1.EnvVar {
		var out []corev1.EnvVar
		for i := 0; i < len(kv); i += 2 {
			out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	probee := func(name string, envs []corev1.EnvVar) corev1.Container {
		return corev1.Container{Name: name, Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, Env: envs}
	}
	late := "late"

	gated := probee("gated", env("TOUCH_FILE", "/started", "TOUCH_AFTER", "3", "LISTEN", ":8081"))
	gated.StartupProbe = &corev1.Probe{ProbeHandler: exec("check", "/started"), PeriodSeconds: 1, FailureThreshold: 30}
	gated.ReadinessProbe = &corev1.Probe{ProbeHandler: httpGet("/ready", 8081), PeriodSeconds: 1}
	gated.LivenessProbe = &corev1.Probe{ProbeHandler: httpGet("/live", 8081), PeriodSeconds: 1, FailureThreshold: 1}

	live := probee("live", env("LISTEN", ":8083"))
	live.LivenessProbe = &corev1.Probe{ProbeHandler: httpGet("/script/"+livenessScript, 8083), PeriodSeconds: 1, FailureThreshold: 3, InitialDelaySeconds: 1}

	grpcC := probee("grpc", env("GRPC_LISTEN", ":9090", "GRPC_LATE_AFTER", "3"))
	grpcC.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9090, Service: &late}}, PeriodSeconds: 1}
	// (Three failures, not one: the first probe may come before the
	// server listens.)
	grpcC.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9090}}, PeriodSeconds: 1, FailureThreshold: 3}

	execSlow := probee("exec-slow", nil)
	execSlow.ReadinessProbe = &corev1.Probe{ProbeHandler: exec("sleep", "2"), PeriodSeconds: 1, TimeoutSeconds: 1}
	execOK := probee("exec-ok", nil)
	execOK.ReadinessProbe = &corev1.Probe{ProbeHandler: exec("sleep", "2"), PeriodSeconds: 1, TimeoutSeconds: 4}

	ready := probee("ready", env("LISTEN", ":8082"))
	ready.ReadinessProbe = &corev1.Probe{ProbeHandler: httpGet("/script/"+readinessScript, 8082),
		PeriodSeconds: 1, SuccessThreshold: 2, FailureThreshold: 3, InitialDelaySeconds: 2, TimeoutSeconds: 1}

	// A pod for each, all at once: the events of a pod's failing probes
	// are told one by one only up to ten (client-go's aggregation, as
	// with the kubelet).
	var made []*corev1.Pod
	run := func(name string, cs ...corev1.Container) (*corev1.Pod, *podHistory) {
		p := e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: cs},
		})
		made = append(made, p)
		return p, e.record(t, p)
	}
	_, gatedHist := run("startup-gate", gated)
	readiness, readinessHist := run("readiness-flips", ready)
	liveness, livenessHist := run("liveness", live)
	grpcPod, grpcHist := run("grpc", grpcC)
	execPod, execHist := run("exec-timeout", execSlow, execOK)
	created := time.Now()

	t.Run("startup probe gates readiness and liveness", func(t *testing.T) {
		vs := gatedHist.until(t, 60*time.Second, "gated started and ready", func(vs []observed) error {
			if cs := containerStatusOf(vs[len(vs)-1].pod, "gated"); cs == nil || cs.Started == nil || !*cs.Started || !cs.Ready {
				return fmt.Errorf("gated: %+v", cs)
			}
			return nil
		})
		// Running, not started, not ready: before the startup probe
		// passed.
		var id string
		for _, v := range vs {
			if cs := containerStatusOf(v.pod, "gated"); cs != nil && cs.State.Running != nil && cs.Started != nil && !*cs.Started {
				if cs.Ready {
					t.Errorf("gated ready before its startup probe passed: %+v", cs)
				}
				id = cs.ContainerID
			}
		}
		if id == "" {
			t.Fatal("gated never reported running but not started")
		}
		last := containerStatusOf(vs[len(vs)-1].pod, "gated")
		if last.ContainerID != id || last.RestartCount != 0 {
			t.Errorf("gated %s restarted %d times, want %s kept", last.ContainerID, last.RestartCount, id)
		}
		// The container's own record: no readiness or liveness request
		// before the file the startup probe checks was made.
		var lines []string
		poll.Until(t, 10*time.Second, "gated asked by both probes", func() error {
			lines = lineTexts(logEntries(t, e.logPath(t, id)))
			if !slices.Contains(lines, "http GET /ready") || !slices.Contains(lines, "http GET /live") {
				return fmt.Errorf("log %q", lines)
			}
			return nil
		})
		touched := slices.Index(lines, "touched /started")
		firstReady, firstLive := slices.Index(lines, "http GET /ready"), slices.Index(lines, "http GET /live")
		if touched < 0 || firstReady < touched || firstLive < touched {
			t.Errorf("gated's log %q: want /ready and /live requested only after \"touched /started\"", lines)
		}
	})

	t.Run("readiness: initialDelaySeconds, successThreshold, failureThreshold, timeoutSeconds; Ready True, False, True", func(t *testing.T) {
		// The flips of the container's ready and the Pod's Ready
		// condition, each with the requests answered by then.
		type flip struct {
			ready    bool
			requests int
		}
		var entries []crilog.Entry
		var flips []flip
		var id string
		readinessHist.until(t, 60*time.Second, "ready, unready and ready again", func(vs []observed) error {
			for _, v := range vs {
				if cs := containerStatusOf(v.pod, "ready"); id == "" && cs != nil && cs.ContainerID != "" {
					id = cs.ContainerID
				}
			}
			if id == "" {
				return fmt.Errorf("no container yet")
			}
			entries = logEntries(t, e.logPath(t, id)) // with times, to tell what was asked by each version
			flips = nil
			prev := false
			for _, v := range vs {
				cs := containerStatusOf(v.pod, "ready")
				if cs == nil || cs.ContainerID == "" {
					continue
				}
				if cs.ContainerID != id {
					return fmt.Errorf("container %s replaced %s", cs.ContainerID, id)
				}
				if cs.Ready != prev {
					flips = append(flips, flip{cs.Ready, scriptRequestsBy(entries, readinessScript, v.at)})
					prev = cs.Ready
				}
				if pr := podCondition(v.pod, corev1.PodReady) == corev1.ConditionTrue; pr != cs.Ready {
					return fmt.Errorf("Pod Ready %v while its one container's ready is %v", pr, cs.Ready)
				}
			}
			if len(flips) < 3 {
				return fmt.Errorf("flips so far %+v", flips)
			}
			return nil
		})
		t.Logf("ready flips (ready, requests answered by then): %+v, %v after Create", flips, time.Since(created).Round(time.Second))
		want := []flip{{true, 5}, {false, 11}, {true, 15}}
		if len(flips) != len(want) {
			t.Fatalf("ready flipped %+v, want %+v", flips, want)
		}
		for i, f := range flips {
			if f.ready != want[i].ready || f.requests < want[i].requests {
				t.Errorf("flip %d: ready %v after %d requests, want %v after request %d at the earliest (pattern %s)",
					i, f.ready, f.requests, want[i].ready, want[i].requests, readinessScript)
			}
		}
		// No probe before initialDelaySeconds: the first request came
		// 2 s or more after the container started.
		started := time.Unix(0, e.criContainer(t, id).StartedAt)
		if first := firstScriptRequest(entries, readinessScript); first.IsZero() || first.Sub(started) < 2*time.Second {
			t.Errorf("first readiness request %v after the container's start, want after initialDelaySeconds 2 s", first.Sub(started))
		}
		// The slow answers were asked for (and the probe gave up on
		// them: the flip to unready at 11 needs both as failures).
		if got := scriptLetters(entries, readinessScript); !strings.HasPrefix(got, readinessScript) {
			t.Errorf("requests answered %q, want the whole pattern %q", got, readinessScript)
		}
		e.containerEvents(t, readiness, "ready", "Unhealthy", func(m string) bool {
			return strings.HasPrefix(m, "Readiness probe failed: ") && strings.Contains(m, "deadline exceeded")
		})
		e.containerEvents(t, readiness, "ready", "Unhealthy", func(m string) bool {
			return strings.HasPrefix(m, "Readiness probe failed: ") && strings.Contains(m, "500")
		})
	})

	t.Run("liveness: failureThreshold failures in a row stop the container", func(t *testing.T) {
		var id string
		livenessHist.until(t, 30*time.Second, "live running", func(vs []observed) error {
			for _, v := range vs {
				if cs := containerStatusOf(v.pod, "live"); cs != nil && cs.State.Running != nil {
					id = cs.ContainerID
					return nil
				}
			}
			return fmt.Errorf("not yet")
		})
		var st *criv1.ContainerStatus
		poll.Until(t, 30*time.Second, "live's first container stopped", func() error {
			if st = e.criContainer(t, id); st.State != criv1.ContainerState_CONTAINER_EXITED {
				return fmt.Errorf("state %s", st.State)
			}
			return nil
		})
		entries := logEntries(t, st.LogPath)
		lines := lineTexts(entries)
		got := scriptLetters(entries, livenessScript)
		if got != livenessScript {
			t.Errorf("liveness requests answered %q, want exactly %q: stopped right after the third failure in a row", got, livenessScript)
		}
		if !slices.Contains(lines, "bye") {
			t.Errorf("log %q: want bye (stopped with SIGTERM)", lines)
		}
		started := time.Unix(0, st.StartedAt)
		if first := firstScriptRequest(entries, livenessScript); first.IsZero() || first.Sub(started) < time.Second {
			t.Errorf("first liveness request %v after the container's start, want after initialDelaySeconds 1 s", first.Sub(started))
		}
		e.containerEvents(t, liveness, "live", "Killing", func(string) bool { return true })
		e.containerEvents(t, liveness, "live", "Unhealthy", func(m string) bool { return strings.HasPrefix(m, "Liveness probe failed: ") })
		livenessHist.until(t, 30*time.Second, "live restarted", func(vs []observed) error {
			if cs := containerStatusOf(vs[len(vs)-1].pod, "live"); cs == nil || cs.RestartCount < 1 {
				return fmt.Errorf("live: %+v", cs)
			}
			return nil
		})
	})

	t.Run("grpc probe asks the container's gRPC health server", func(t *testing.T) {
		vs := grpcHist.until(t, 30*time.Second, "grpc ready", func(vs []observed) error {
			if cs := containerStatusOf(vs[len(vs)-1].pod, "grpc"); cs == nil || !cs.Ready {
				return fmt.Errorf("grpc: %+v", cs)
			}
			return nil
		})
		var id string
		var readyAt time.Time
		for _, v := range vs {
			cs := containerStatusOf(v.pod, "grpc")
			if cs != nil && cs.State.Running != nil && id == "" {
				id = cs.ContainerID
				if cs.Ready {
					t.Errorf("grpc ready as soon as it runs, while its service is NOT_SERVING")
				}
			}
			if cs != nil && cs.Ready && readyAt.IsZero() {
				readyAt = v.at
			}
		}
		entries := logEntries(t, e.logPath(t, id))
		i := slices.Index(lineTexts(entries), "grpc late SERVING")
		if i < 0 || readyAt.Before(entries[i].Time) {
			t.Errorf("ready at %v, want after the service became SERVING (log %v)", readyAt, lineTexts(entries))
		}
		e.containerEvents(t, grpcPod, "grpc", "Unhealthy", func(m string) bool {
			return strings.HasPrefix(m, "Readiness probe failed: ") && strings.Contains(m, "NOT_SERVING")
		})
		if cs := containerStatusOf(vs[len(vs)-1].pod, "grpc"); cs.RestartCount != 0 {
			t.Errorf("grpc restarted %d times: its liveness probe on the serving server failed", cs.RestartCount)
		}
	})

	t.Run("exec probe slower than timeoutSeconds fails", func(t *testing.T) {
		vs := execHist.until(t, 30*time.Second, "exec-ok ready", func(vs []observed) error {
			if cs := containerStatusOf(vs[len(vs)-1].pod, "exec-ok"); cs == nil || !cs.Ready {
				return fmt.Errorf("exec-ok: %+v", cs)
			}
			return nil
		})
		evs := e.containerEvents(t, execPod, "exec-slow", "Unhealthy", func(m string) bool {
			return strings.HasPrefix(m, "Readiness probe failed: ") && strings.Contains(m, "deadline exceeded")
		})
		// Three more runs of the same probe, with 4 s to answer instead
		// of 1, that readied exec-ok: done once a fourth has begun (a
		// container's probe runs one at a time).
		slow := containerStatusOf(vs[len(vs)-1].pod, "exec-slow")
		if slow == nil || slow.ContainerID == "" {
			t.Fatalf("exec-slow has no container yet: %+v", slow)
		}
		runs := spy.execCount(slow.ContainerID)
		poll.Until(t, 30*time.Second, "three more exec-slow probes", func() error {
			if n := spy.execCount(slow.ContainerID); n < runs+4 {
				return fmt.Errorf("%d so far", n-runs)
			}
			return nil
		})
		for _, v := range execHist.all() {
			if cs := containerStatusOf(v.pod, "exec-slow"); cs != nil && cs.Ready {
				t.Fatalf("exec-slow ready with a probe that takes 2 s of its 1 s timeout")
			}
		}
		t.Logf("exec-slow: %s", evs[0].Message)
	})

	for _, p := range made {
		e.deletePod(t, p)
	}
}

func lineTexts(entries []crilog.Entry) []string {
	var out []string
	for _, en := range entries {
		out = append(out, string(en.Line))
	}
	return out
}

// scriptRequest parses probee's "script PATTERN #n: L" line.
func scriptRequest(line, pattern string) (n int, letter string, ok bool) {
	rest, ok := strings.CutPrefix(line, "script "+pattern+" #")
	if !ok {
		return 0, "", false
	}
	num, letter, ok := strings.Cut(rest, ": ")
	n, err := strconv.Atoi(num)
	return n, letter, ok && err == nil
}

// scriptRequestsBy is how many requests to /script/pattern the container
// had been asked by t.
func scriptRequestsBy(entries []crilog.Entry, pattern string, t time.Time) int {
	max := 0
	for _, en := range entries {
		if n, _, ok := scriptRequest(string(en.Line), pattern); ok && !en.Time.After(t) && n > max {
			max = n
		}
	}
	return max
}

// scriptLetters are the answers to the requests to /script/pattern, in
// order.
func scriptLetters(entries []crilog.Entry, pattern string) string {
	var b strings.Builder
	for _, en := range entries {
		if _, l, ok := scriptRequest(string(en.Line), pattern); ok {
			b.WriteString(l)
		}
	}
	return b.String()
}

func firstScriptRequest(entries []crilog.Entry, pattern string) time.Time {
	for _, en := range entries {
		if _, _, ok := scriptRequest(string(en.Line), pattern); ok {
			return en.Time
		}
	}
	return time.Time{}
}
