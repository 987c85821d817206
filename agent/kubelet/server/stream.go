package server

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	"k8s.io/apimachinery/pkg/util/proxy"
	translator "k8s.io/apiserver/pkg/util/proxy"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// streamOptions are the query parameters of /exec and /attach, as the API
// server sends them from PodExecOptions and PodAttachOptions.
type streamOptions struct {
	command                    []string
	stdin, stdout, stderr, tty bool
}

// parseStreamOptions reads the parameters; exec needs a command.
func parseStreamOptions(q url.Values, exec bool) (streamOptions, error) {
	var errs []error
	o := streamOptions{
		command: q[corev1.ExecCommandParam],
		stdin:   queryBool(q, corev1.ExecStdinParam, &errs),
		stdout:  queryBool(q, corev1.ExecStdoutParam, &errs),
		stderr:  queryBool(q, corev1.ExecStderrParam, &errs),
		tty:     queryBool(q, corev1.ExecTTYParam, &errs),
	}
	if exec && len(o.command) == 0 {
		errs = append(errs, errors.New("no command to run: set command"))
	}
	// A terminal has one output: the runtime writes stderr to it.
	if o.tty {
		o.stderr = false
	}
	if !o.stdin && !o.stdout && !o.stderr {
		errs = append(errs, errors.New("set at least one of input, output and error to stream"))
	}
	return o, errors.Join(errs...)
}

// parsePorts reads the port parameters of /portForward (a WebSocket
// client names its ports there; a SPDY client names each in its stream).
func parsePorts(q url.Values) ([]int32, error) {
	var ports []int32
	for _, v := range q[corev1.PortHeader] {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("port=%q is not a port from 1 to 65535", v)
		}
		ports = append(ports, int32(p))
	}
	return ports, nil
}

// exec runs a command in a container with its stdio streamed, as kubectl
// exec asks for it through the API server.
func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	o, err := parseStreamOptions(r.URL.Query(), true)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var resp *criv1.ExecResponse
	if !s.onContainer(w, r, "exec in the container", func(id string) (err error) {
		resp, err = s.cfg.Runtime.Exec(r.Context(), &criv1.ExecRequest{ContainerId: id, Cmd: o.command,
			Tty: o.tty, Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr})
		return err
	}) {
		return
	}
	s.proxyStream(w, r, resp.Url, o)
}

// attach streams the stdio of a container's process, as kubectl attach
// asks for it.
func (s *server) attach(w http.ResponseWriter, r *http.Request) {
	o, err := parseStreamOptions(r.URL.Query(), false)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var resp *criv1.AttachResponse
	if !s.onContainer(w, r, "attach to the container", func(id string) (err error) {
		resp, err = s.cfg.Runtime.Attach(r.Context(), &criv1.AttachRequest{ContainerId: id,
			Tty: o.tty, Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr})
		return err
	}) {
		return
	}
	s.proxyStream(w, r, resp.Url, o)
}

// portForward tunnels connections to ports in the pod's network
// namespace, as kubectl port-forward asks for it.
func (s *server) portForward(w http.ResponseWriter, r *http.Request) {
	ports, err := parsePorts(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	pod, ok := s.pod(w, r)
	if !ok {
		return
	}
	var resp *criv1.PortForwardResponse
	if !s.reach(w, "forward the pod's ports", s.targets.sandbox(r.Context(), pod.UID), func() (string, bool) {
		return s.latestSandbox(w, r, pod)
	}, func(id string) (err error) {
		resp, err = s.cfg.Runtime.PortForward(r.Context(), &criv1.PortForwardRequest{PodSandboxId: id, Port: ports})
		return err
	}) {
		return
	}
	s.proxyStream(w, r, resp.Url, streamOptions{})
}

// pod finds the pod of the request's path, its UID too if the path has
// one; if there is none, it answers 404 as the kubelet does.
func (s *server) pod(w http.ResponseWriter, r *http.Request) (*corev1.Pod, bool) {
	pod, err := s.cfg.Pods.Pods(r.PathValue("namespace")).Get(r.PathValue("pod"))
	if err == nil && r.PathValue("uid") != "" && pod.UID != types.UID(r.PathValue("uid")) {
		err = apierrors.NewNotFound(corev1.Resource("pods"), pod.Name)
	}
	if apierrors.IsNotFound(err) {
		http.Error(w, "pod does not exist", http.StatusNotFound)
		return nil, false
	}
	if err != nil {
		http.Error(w, "get the pod: "+err.Error(), http.StatusInternalServerError)
		return nil, false
	}
	return pod, true
}

// onContainer calls call with the CRI container of the request's path:
// the running one of the pod's container of that name, or else the latest
// attempt, running or not, so that the runtime says why a stopped one
// cannot be streamed. If the pod has no such container, it answers 404,
// as the kubelet does.
func (s *server) onContainer(w http.ResponseWriter, r *http.Request, what string, call func(id string) error) bool {
	pod, ok := s.pod(w, r)
	if !ok {
		return false
	}
	name := r.PathValue("container")
	if !hasContainer(pod, name) {
		http.Error(w, fmt.Sprintf("container not found (%q)", name), http.StatusNotFound)
		return false
	}
	return s.reach(w, what, s.targets.container(r.Context(), pod.UID, name), func() (string, bool) {
		return s.latestContainer(w, r, pod, name)
	}, call)
}

// reach calls call with the target the runtime listed lately, cached. If
// there is none, or the runtime refuses it and lookup, which asks the
// runtime now, names another, call is made with that one. An error is
// answered as the runtime's (criError), what says what was asked.
func (s *server) reach(w http.ResponseWriter, what, cached string, lookup func() (string, bool), call func(id string) error) bool {
	var err error
	if cached != "" {
		if err = call(cached); err == nil {
			return true
		}
		s.targets.forget()
	}
	id, ok := lookup()
	if !ok {
		return false
	}
	if id != cached {
		err = call(id)
	}
	if err != nil {
		criError(w, what, err)
		return false
	}
	return true
}

// latestContainer asks the runtime for the pod's latest container of that
// name, or answers 404 if it has none.
func (s *server) latestContainer(w http.ResponseWriter, r *http.Request, pod *corev1.Pod, name string) (string, bool) {
	resp, err := s.cfg.Runtime.ListContainers(r.Context(), &criv1.ListContainersRequest{Filter: &criv1.ContainerFilter{
		LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID), pods.LabelContainerName: name},
	}})
	if err != nil {
		criError(w, "list the pod's containers", err)
		return "", false
	}
	if len(resp.Containers) == 0 {
		http.Error(w, fmt.Sprintf("container not found (%q)", name), http.StatusNotFound)
		return "", false
	}
	latest := slices.MaxFunc(resp.Containers, func(a, b *criv1.Container) int {
		return cmp.Or(cmp.Compare(a.GetMetadata().GetAttempt(), b.GetMetadata().GetAttempt()), cmp.Compare(a.CreatedAt, b.CreatedAt))
	})
	return latest.Id, true
}

// latestSandbox asks the runtime for the pod's ready sandbox, or answers
// 404 if it has none.
func (s *server) latestSandbox(w http.ResponseWriter, r *http.Request, pod *corev1.Pod) (string, bool) {
	sandboxes, err := s.cfg.Runtime.ListPodSandbox(r.Context(), &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{
		State:         &criv1.PodSandboxStateValue{State: criv1.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)},
	}})
	if err != nil {
		criError(w, "list the pod's sandboxes", err)
		return "", false
	}
	if len(sandboxes.Items) == 0 {
		http.Error(w, fmt.Sprintf("pod %q has no running sandbox", pod.Namespace+"/"+pod.Name), http.StatusNotFound)
		return "", false
	}
	return sandboxes.Items[0].Id, true
}

// criError answers a failed CRI call: 404 for what the runtime does not
// have, 500 for the rest, with the runtime's message.
func criError(w http.ResponseWriter, what string, err error) {
	code := http.StatusInternalServerError
	if status.Code(err) == codes.NotFound {
		code = http.StatusNotFound
	}
	http.Error(w, what+": "+status.Convert(err).Message(), code)
}

// DeclaredFeatures are the Node features (status.declaredFeatures) that
// the server implements: with ExtendWebSocketsToKubelet the API server
// hands kubectl's WebSocket streams on as they are rather than translate
// them to SPDY itself, and the server translates them, as the kubelet
// does.
var DeclaredFeatures = []string{"ExtendWebSocketsToKubelet"}

// proxyStream hands the upgraded connection to the runtime's streaming
// server at rawURL, which speaks SPDY, and copies bytes both ways until
// either side closes; then both are closed. A WebSocket stream that the
// API server passes on (DeclaredFeatures) is translated: exec and
// attach's stream-close protocol (v5) stream by stream, as o says, and
// port-forward's tunneling protocol as SPDY inside WebSocket frames.
func (s *server) proxyStream(w http.ResponseWriter, r *http.Request, rawURL string, o streamOptions) {
	u, err := url.Parse(rawURL)
	if err != nil {
		http.Error(w, fmt.Sprintf("runtime's streaming URL %q: %v", rawURL, err), http.StatusInternalServerError)
		return
	}
	// The client's credentials are for this server, not the runtime's.
	r.Header.Del("Authorization")
	var h http.Handler = proxy.NewUpgradeAwareHandler(u, nil, false, true, streamResponder{s})
	switch {
	case wsstream.IsWebSocketRequestWithStreamCloseProtocol(r):
		h = translator.NewStreamTranslatorHandler(u, nil, 0, translator.Options{Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr, Tty: o.tty})
	case wsstream.IsWebSocketRequestWithTunnelingProtocol(r):
		h = translator.NewTunnelingHandler(h)
	}
	h.ServeHTTP(closingHijacker{w, r.Context()}, r)
}

// closingHijacker closes the connection it hijacks when ctx ends: the
// server's http.Server.Shutdown does not know of hijacked connections, and
// a stream must not outlive the server. The request's context ends with
// the server's, or once the handler returns, when the proxy has closed the
// connection already.
type closingHijacker struct {
	http.ResponseWriter
	ctx context.Context
}

func (h closingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err == nil {
		context.AfterFunc(h.ctx, func() { c.Close() })
	}
	return c, rw, err
}

// streamResponder answers a stream that could not reach the runtime.
type streamResponder struct{ s *server }

func (sr streamResponder) Error(w http.ResponseWriter, r *http.Request, err error) {
	sr.s.cfg.Log.Warn("kubelet server: stream not proxied to the runtime", "path", r.URL.Path, "err", err)
	http.Error(w, "stream to the runtime: "+err.Error(), http.StatusInternalServerError)
}
