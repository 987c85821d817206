package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cairn-os/cairn/internal/crilog"
)

// pods answers the node's pods as a PodList.
func (s *server) pods(w http.ResponseWriter, _ *http.Request) {
	pods, err := s.cfg.Pods.List(labels.Everything())
	if err != nil {
		http.Error(w, "list the pods: "+err.Error(), http.StatusInternalServerError)
		return
	}
	list := corev1.PodList{}
	list.Kind, list.APIVersion = "PodList", "v1"
	for _, p := range pods {
		list.Items = append(list.Items, *p)
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&list); err != nil {
		s.cfg.Log.Debug("kubelet server: /pods not sent", "err", err)
	}
}

// logOptions are the query parameters of /containerLogs.
type logOptions struct {
	follow, timestamps, previous bool
	tail                         int // negative: every line
	since                        time.Time
	limitBytes                   int64 // 0: no limit
}

// parseLogOptions reads the parameters as the API server sends them from
// PodLogOptions.
func parseLogOptions(q url.Values, now time.Time) (logOptions, error) {
	o := logOptions{tail: -1}
	var errs []error
	number := func(name string) (int64, bool) {
		v := q.Get(name)
		if v == "" {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("%s=%q is not a number of at least 0", name, v))
			return 0, false
		}
		return n, true
	}
	o.follow, o.timestamps, o.previous = queryBool(q, "follow", &errs), queryBool(q, "timestamps", &errs), queryBool(q, "previous", &errs)
	if n, ok := number("tailLines"); ok {
		o.tail = int(n)
	}
	if n, ok := number("limitBytes"); ok {
		if n == 0 {
			errs = append(errs, errors.New("limitBytes must be at least 1"))
		}
		o.limitBytes = n
	}
	if n, ok := number("sinceSeconds"); ok {
		o.since = now.Add(-time.Duration(n) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("sinceTime=%q is not an RFC 3339 time", v))
		}
		if q.Has("sinceSeconds") {
			errs = append(errs, errors.New("set only one of sinceSeconds and sinceTime"))
		}
		o.since = t
	}
	return o, errors.Join(errs...)
}

// queryBool reads the boolean parameter name, false if it is unset; a
// value that is not one adds its error to errs.
func queryBool(q url.Values, name string, errs *[]error) bool {
	v := q.Get(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q is not true or false", name, v))
	}
	return b
}

// containerLogs sends a container's log, as kubectl logs asks for it
// through the API server.
func (s *server) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, name, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	o, err := parseLogOptions(r.URL.Query(), time.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	pod, err := s.cfg.Pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		http.Error(w, fmt.Sprintf("pod %q does not exist", ns+"/"+name), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, "get the pod: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if !hasContainer(pod, container) {
		http.Error(w, fmt.Sprintf("container %q not found in pod %q", container, ns+"/"+name), http.StatusNotFound)
		return
	}
	path, err := crilog.Find(s.cfg.PodLogRoot, ns, name, container, o.previous)
	if errors.Is(err, crilog.ErrNotFound) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	lw := &limitWriter{w: w, limit: o.limitBytes > 0, left: o.limitBytes}
	flusher, _ := w.(http.Flusher)
	so := crilog.StreamOptions{Tail: o.tail, Since: o.since, Follow: o.follow, Poll: logPoll,
		// A previous attempt is not written to any more, nor is one that a
		// newer attempt followed.
		Stop: func() bool {
			if o.previous || !s.running(ns, name, container) {
				return true
			}
			latest, err := crilog.Find(s.cfg.PodLogRoot, ns, name, container, false)
			return err != nil || latest != path
		}}
	err = crilog.Stream(r.Context(), path, so, func(es []crilog.Entry) error {
		for _, e := range es {
			var line []byte
			if o.timestamps {
				line = e.Time.AppendFormat(line, time.RFC3339Nano)
				line = append(line, ' ')
			}
			line = append(append(line, e.Line...), '\n')
			if _, err := lw.Write(line); err != nil {
				return err
			}
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	if err != nil && !errors.Is(err, errLimit) && r.Context().Err() == nil {
		s.cfg.Log.Warn("kubelet server: log not sent", "pod", ns+"/"+name, "container", container, "err", err)
	}
}

// running reports whether the container runs as the pod's status last
// said, which a followed log waits for more of.
func (s *server) running(ns, name, container string) bool {
	pod, err := s.cfg.Pods.Pods(ns).Get(name)
	if err != nil {
		return false
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, st := range list {
			if st.Name == container {
				return st.State.Running != nil
			}
		}
	}
	return false
}

// hasContainer reports whether the pod has a container of that name.
func hasContainer(pod *corev1.Pod, name string) bool {
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// errLimit ends a log at limitBytes.
var errLimit = errors.New("limitBytes reached")

// limitWriter writes to w, at most left bytes if limit is set, and then
// fails with errLimit.
type limitWriter struct {
	w     io.Writer
	limit bool
	left  int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.limit && int64(len(p)) > l.left {
		n, err := l.w.Write(p[:l.left])
		l.left -= int64(n)
		if err == nil {
			err = errLimit
		}
		return n, err
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}
