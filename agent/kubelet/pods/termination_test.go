package pods

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criLog is lines as containerd logs them, the last without a newline
// (a P entry) if partial.
func criLog(lines []string, partial string) string {
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "2026-01-02T15:04:05.000000001Z stdout F %s\n", l)
	}
	if partial != "" {
		fmt.Fprintf(&b, "2026-01-02T15:04:05.000000002Z stderr P %s\n", partial)
	}
	return b.String()
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTerminationMessage(t *testing.T) {
	dir := t.TempDir()
	file := func(name, data string) string {
		p := filepath.Join(dir, name)
		write(t, p, data)
		return p
	}
	done := file("done", "DONE")
	empty := file("empty", "")
	long := file("long", strings.Repeat("a", 10)+strings.Repeat("b", maxMessageFile))
	log := file("0.log", criLog([]string{"starting", "failed: no disk"}, "DONE"))

	exited := func(code int32, policy corev1.TerminationMessagePolicy, hostPath string) *criv1.ContainerStatus {
		cs := &criv1.ContainerStatus{
			State: criv1.ContainerState_CONTAINER_EXITED, ExitCode: code, LogPath: log,
			Annotations: map[string]string{annotationMessagePath: "/dev/termination-log", annotationMessagePolicy: string(policy)},
		}
		if hostPath != "" {
			cs.Mounts = []*criv1.Mount{{ContainerPath: "/data", HostPath: dir}, {ContainerPath: "/dev/termination-log", HostPath: hostPath}}
		}
		return cs
	}
	fromLogs := corev1.TerminationMessageFallbackToLogsOnError
	for _, tc := range []struct {
		name string
		cs   *criv1.ContainerStatus
		want string
	}{
		{"the file", exited(0, corev1.TerminationMessageReadFile, done), "DONE"},
		{"the file of a failed container", exited(1, corev1.TerminationMessageReadFile, done), "DONE"},
		{"an empty file", exited(1, corev1.TerminationMessageReadFile, empty), ""},
		{"the end of a long file", exited(0, corev1.TerminationMessageReadFile, long), strings.Repeat("b", maxMessageFile)},
		{"the file before the logs", exited(1, fromLogs, done), "DONE"},
		{"the logs of a failed container with an empty file", exited(1, fromLogs, empty), "starting\nfailed: no disk\nDONE"},
		{"the logs of a failed container without its file", exited(1, fromLogs, filepath.Join(dir, "absent")), "starting\nfailed: no disk\nDONE"},
		{"no logs for a container that succeeded", exited(0, fromLogs, empty), ""},
		{"no message without a terminationMessagePath", &criv1.ContainerStatus{State: criv1.ContainerState_CONTAINER_EXITED, ExitCode: 1, LogPath: log}, ""},
		{"no logs for a container that could not run", func() *criv1.ContainerStatus {
			cs := exited(128, fromLogs, empty)
			cs.Reason = "ContainerCannotRun"
			return cs
		}(), ""},
	} {
		if got := terminationMessage(tc.cs); got != tc.want {
			t.Errorf("%s: terminationMessage = %q, want %q", tc.name, got, tc.want)
		}
	}

	// The runtime's message comes first.
	cs := exited(0, corev1.TerminationMessageReadFile, done)
	cs.Message = "runtime says"
	if got := containerStatus("c", cs).Message; got != "runtime says: DONE" {
		t.Errorf("containerStatus message = %q, want the runtime's, then the file's", got)
	}
}

func TestLogEnd(t *testing.T) {
	dir := t.TempDir()
	var many []string
	for i := range 300 {
		many = append(many, fmt.Sprintf("line %d", i))
	}
	var wide []string
	for i := range 40 {
		wide = append(wide, fmt.Sprintf("%03d %s", i, strings.Repeat("w", 1500)))
	}
	wideText := strings.Join(wide, "\n") + "\n"
	// A line longer than the first window read, which containerd split:
	// the window begins inside it, and grows to take it in.
	x := strings.Repeat("x", 16<<10)
	split := criLog([]string{"first"}, "") + "2026-01-02T15:04:06Z stdout P " + x + "\n" + criLog([]string{"end"}, "")
	splitText := "first\n" + x + "end\n"
	for _, tc := range []struct {
		name, log, want string
	}{
		{"the last 80 lines", criLog(many, ""), strings.Join(many[220:], "\n") + "\n"},
		{"a last line without newline", criLog(many[:3], "end"), "line 0\nline 1\nline 2\nend"},
		{"the last bytes of long lines", criLog(wide, ""), wideText[len(wideText)-maxMessageLogBytes:]},
		{"a line split in entries", split, splitText[len(splitText)-maxMessageLogBytes:]},
		{"an empty log", "", ""},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		write(t, path, tc.log)
		got, err := logEnd(path)
		if err != nil {
			t.Fatalf("%s: logEnd: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: logEnd = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestCapMessages(t *testing.T) {
	big := strings.Repeat("m", 5000)
	st := &Status{
		InitContainers: []ContainerStatus{{State: Terminated, Message: big}},
		Containers:     []ContainerStatus{{State: Terminated, Message: big}, {State: Waiting, Message: big}, {State: Terminated, Message: "short"}},
	}
	st.capMessages()
	share := maxPodMessages / 4
	for _, c := range []struct {
		name string
		got  string
		want int
	}{
		{"init container", st.InitContainers[0].Message, share},
		{"terminated container", st.Containers[0].Message, share},
		{"waiting container", st.Containers[1].Message, len(big)},
		{"short message", st.Containers[2].Message, len("short")},
	} {
		if len(c.got) != c.want {
			t.Errorf("%s: message of %d bytes, want %d", c.name, len(c.got), c.want)
		}
	}
}

func TestMessageFiles(t *testing.T) {
	root := t.TempDir()
	w := &Worker{cfg: Config{PodsDir: root}}
	pod := &corev1.Pod{}
	pod.UID = types.UID("uid-1")
	c := &corev1.Container{Name: "app", TerminationMessagePath: "/dev/termination-log"}

	old := syscall.Umask(0o077)
	m, err := w.messageMount(pod, c, 2)
	syscall.Umask(old)
	if err != nil {
		t.Fatalf("messageMount: %v", err)
	}
	want := filepath.Join(root, "uid-1", "containers", "app", "2")
	if m.HostPath != want || m.ContainerPath != c.TerminationMessagePath {
		t.Errorf("messageMount = %v, want %s at %s", m, want, c.TerminationMessagePath)
	}
	if info, err := os.Stat(want); err != nil || info.Mode().Perm() != 0o666 || info.Size() != 0 {
		t.Errorf("message file %v (%v), want empty and writable by anyone", info, err)
	}
	// The same attempt made again starts from an empty file.
	write(t, want, "left over")
	if _, err := w.messageMount(pod, c, 2); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(want); len(data) != 0 {
		t.Errorf("message file made again holds %q, want it empty", data)
	}
	if m, err := w.messageMount(pod, &corev1.Container{Name: "none"}, 0); m != nil || err != nil {
		t.Errorf("messageMount without terminationMessagePath = %v, %v; want none", m, err)
	}

	// Removed with the pod, and the pod's directory with them unless
	// something else is left in it.
	vol := filepath.Join(root, "uid-1", "volumes")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.removePodFiles(pod.UID); err != nil {
		t.Fatalf("removePodFiles: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "uid-1", "containers")); !os.IsNotExist(err) {
		t.Errorf("containers directory after removePodFiles: %v, want it gone", err)
	}
	if _, err := os.Stat(vol); err != nil {
		t.Errorf("volumes after removePodFiles: %v, want them left", err)
	}
	if err := os.Remove(vol); err != nil {
		t.Fatal(err)
	}
	if _, err := w.messageMount(pod, c, 3); err != nil {
		t.Fatal(err)
	}
	if err := w.removePodFiles(pod.UID); err != nil {
		t.Fatalf("removePodFiles: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "uid-1")); !os.IsNotExist(err) {
		t.Errorf("pod directory after removePodFiles: %v, want it gone", err)
	}
}
