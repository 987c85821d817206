package pods

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/internal/crilog"
)

// Termination messages, as the kubelet keeps them. Each attempt of a
// container with a terminationMessagePath gets an empty file of its own on
// the host,
//
//	<PodsDir>/<pod UID>/containers/<container>/<attempt>
//
// that anyone may write (a container need not run as root to leave its
// message), bind-mounted at that path. When the container has exited, the
// end of the file is its state.terminated.message; with the policy
// FallbackToLogsOnError, a container that failed and left the file empty
// has the end of its log instead. The files go with the pod (Terminate,
// and Cleanup for pods the node no longer has).
const (
	// maxMessageFile is how much of a message file is read, from its end.
	maxMessageFile = 4 << 10
	// maxMessageLogLines and maxMessageLogBytes bound the end of the log
	// that stands for a message.
	maxMessageLogLines = 80
	maxMessageLogBytes = 2 << 10
	// maxPodMessages bounds the messages of a pod's containers together:
	// each gets an equal share of it.
	maxPodMessages = 12 << 10
)

// Annotations of a container that keep its termination message settings
// with it, the kubelet's names, for reading the message once it exited.
const (
	annotationMessagePath   = "io.kubernetes.container.terminationMessagePath"
	annotationMessagePolicy = "io.kubernetes.container.terminationMessagePolicy"
)

// messageAnnotations are the annotations of c's CRI container.
func messageAnnotations(c *corev1.Container) map[string]string {
	if c.TerminationMessagePath == "" {
		return nil
	}
	return map[string]string{
		annotationMessagePath:   c.TerminationMessagePath,
		annotationMessagePolicy: string(c.TerminationMessagePolicy),
	}
}

// containersDir holds the termination message files of the pod uid's
// containers; empty if the worker keeps none.
func (w *Worker) containersDir(uid types.UID) string {
	if w.cfg.PodsDir == "" {
		return ""
	}
	return filepath.Join(w.cfg.PodsDir, string(uid), "containers")
}

// messageMount makes the empty termination message file of the attempt-th
// container of c and returns its mount; nil if c has no
// terminationMessagePath or the worker keeps no files.
func (w *Worker) messageMount(pod *corev1.Pod, c *corev1.Container, attempt uint32) (*criv1.Mount, error) {
	dir := w.containersDir(pod.UID)
	if dir == "" || c.TerminationMessagePath == "" {
		return nil, nil
	}
	dir = filepath.Join(dir, c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("termination message file: %w", err)
	}
	path := filepath.Join(dir, strconv.FormatUint(uint64(attempt), 10))
	// Truncated: an attempt whose container could not be made is made
	// again with the same file.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o666)
	if err != nil {
		return nil, fmt.Errorf("termination message file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("termination message file: %w", err)
	}
	// Whatever the umask, for any user the container runs as.
	if err := os.Chmod(path, 0o666); err != nil {
		return nil, fmt.Errorf("termination message file: %w", err)
	}
	return &criv1.Mount{ContainerPath: c.TerminationMessagePath, HostPath: path}, nil
}

// removePodFiles removes the files the worker made for the pod uid in
// its directory under PodsDir (termination messages, /etc/hosts), and the
// directory unless something else (volumes) is left in it.
func (w *Worker) removePodFiles(uid types.UID) error {
	dir := w.containersDir(uid)
	if dir == "" {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove termination messages of pod %s: %w", uid, err)
	}
	podDir := filepath.Dir(dir)
	if err := os.Remove(filepath.Join(podDir, etcHostsFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the hosts file of pod %s: %w", uid, err)
	}
	// ENOTEMPTY is ErrExist.
	if err := os.Remove(podDir); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("remove the directory of pod %s: %w", uid, err)
	}
	return nil
}

// removeOrphanPodFiles removes the files the worker made for the pods
// that keep does not keep (removePodFiles).
func (w *Worker) removeOrphanPodFiles(keep func(types.UID) bool) {
	if w.cfg.PodsDir == "" {
		return
	}
	ents, err := os.ReadDir(w.cfg.PodsDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			w.cfg.Log.Warn("housekeeping: list pods' files", "err", err)
		}
		return
	}
	for _, e := range ents {
		uid := types.UID(e.Name())
		if !e.IsDir() || keep(uid) {
			continue
		}
		if err := w.removePodFiles(uid); err != nil {
			w.cfg.Log.Warn("housekeeping: remove the files of a pod the node no longer has", "uid", uid, "err", err)
		}
	}
}

// terminationMessage is what the exited container cs left as its message:
// the end of the file mounted at its terminationMessagePath or, by its
// policy, the end of its log.
func terminationMessage(cs *criv1.ContainerStatus) string {
	path := cs.Annotations[annotationMessagePath]
	if path == "" {
		return ""
	}
	// A container that could not even start has no log to fall back to.
	fallback := cs.Annotations[annotationMessagePolicy] == string(corev1.TerminationMessageFallbackToLogsOnError) &&
		cs.ExitCode != 0 && cs.Reason != "ContainerCannotRun"
	for _, m := range cs.Mounts {
		if m.ContainerPath != path {
			continue
		}
		data, err := readEnd(m.HostPath, maxMessageFile)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Sprintf("Error on reading termination log %s: %v", m.HostPath, err)
		case len(data) > 0 || !fallback:
			return string(data)
		}
		break
	}
	if !fallback || cs.LogPath == "" {
		return ""
	}
	msg, err := logEnd(cs.LogPath)
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	return msg
}

// readEnd reads the last n bytes of the file at path, all of it if it is
// shorter.
func readEnd(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off := info.Size() - n; off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// logEnd is the end of the CRI log at path as a message: its last
// maxMessageLogLines lines, each ended by a newline but a last one left
// unended, cut to their last maxMessageLogBytes. Only the end of the file
// is read, more of it while that holds too few lines.
func logEnd(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", err
	}
	for window := int64(16 << 10); ; window *= 2 {
		off := max(info.Size()-window, 0)
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return "", err
		}
		r := bufio.NewReader(io.LimitReader(f, info.Size()-off))
		if off > 0 {
			// The window may begin inside an entry: from the next.
			if _, err := r.ReadBytes('\n'); err != nil && err != io.EOF {
				return "", err
			}
		}
		es, rd, err := crilog.Tail(r, maxMessageLogLines)
		if err != nil {
			return "", err
		}
		var b bytes.Buffer
		for _, e := range es {
			b.Write(e.Line)
			b.WriteByte('\n')
		}
		b.Write(rd.Partial())
		if off == 0 || len(es) == maxMessageLogLines || b.Len() >= maxMessageLogBytes {
			msg := b.Bytes()
			return string(msg[max(len(msg)-maxMessageLogBytes, 0):]), nil
		}
	}
}
