package conformance

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/test/agentnode"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/repo"
	"github.com/cairn-os/cairn/test/runtime"
)

// EnvBin names the directory of e2e.test, ginkgo and the binaries of the
// images (hack/build-conformance.sh); default
// _out/conformance/bin of the repository. kubectl is the control plane's,
// in kube.EnvBin.
const EnvBin = "CAIRN_CONFORMANCE_BIN"

// NodeName is the Cairn node's.
const NodeName = "cairn-conformance"

// Suite says which specs to run, as ginkgo's regular expressions on their
// full names, and how.
type Suite struct {
	Focus, Skip string
	// Procs is how many ginkgo processes run specs at once: the specs wait
	// far more than they compute, so well above the core count.
	Procs int
	// Timeout bounds the whole ginkgo run.
	Timeout time.Duration
	// ReportDir receives the suite's JUnit report (junit_01.xml) and its
	// output (e2e.log); default a temporary directory of tb.
	ReportDir string
}

// Result is what the specs did.
type Result struct {
	Passed, Failed, Skipped []string // full spec names
	// Missing are the images the suite names that were not built.
	Missing []string
	Took    time.Duration
}

// Summary is the one line of counts, to compare from run to run.
func (r Result) Summary() string {
	return fmt.Sprintf("conformance: %d passed, %d failed, %d skipped in %s",
		len(r.Passed), len(r.Failed), len(r.Skipped), r.Took.Round(time.Second))
}

// Run starts the control plane (with kube-scheduler), containerd, a
// registry with the suite's images and cairn-agent as Node NodeName, runs
// the suite's specs of s in ginkgo's parallel processes, and returns what
// they did. Everything it started is stopped and removed when tb ends; the
// report stays in s.ReportDir. It fails tb only when the suite could not
// run; failed specs are in the Result.
func Run(tb testing.TB, s Suite) Result {
	tb.Helper()
	need.Root(tb, "containerd and cairn-agent run as root")
	// The API server reaches the kubelet server at the Node's InternalIP,
	// one of the host's addresses.
	c := kube.Start(tb, kube.Options{Scheduler: true, APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP"}})
	rt := runtime.Start(tb)
	reg := registry.Start(tb)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		tb.Fatal(err)
	}
	agent := agentnode.Start(tb, c, rt, agentnode.Options{Name: NodeName, Bin: agentnode.Build(tb)})
	poll.Until(tb, 2*time.Minute, "Node "+NodeName+" Ready", func() error { return nodeReady(c, NodeName) })
	res := RunOn(tb, s, Target{Kubeconfig: c.AdminKubeconfig, Registry: reg, Pull: reg.Addr})
	if err := agent.Running(); err != nil {
		tb.Error(err)
	}
	return res
}

// Target is a cluster that the suite runs against.
type Target struct {
	Kubeconfig string
	// Registry is where the suite's images are pushed, and Pull its
	// address as the nodes name it.
	Registry *registry.Registry
	Pull     string
}

// EnvFocus, if set, replaces a run's focus: a run of the specs it matches
// but Skip, such as those that failed last time.
const EnvFocus = "CAIRN_CONFORMANCE_FOCUS"

// FocusFromEnv is EnvFocus if set, else focus.
func FocusFromEnv(focus string) string {
	if f := os.Getenv(EnvFocus); f != "" {
		return f
	}
	return focus
}

// RunOn pushes the suite's images to t's registry, runs the specs of s
// against t in ginkgo's parallel processes, and returns what they did.
// The report stays in s.ReportDir. It fails tb only when the suite could
// not run; failed specs are in the Result.
func RunOn(tb testing.TB, s Suite, t Target) Result {
	tb.Helper()
	dir := binDir(tb)
	e2eTest, ginkgo := filepath.Join(dir, "e2e.test"), filepath.Join(dir, "ginkgo")
	for _, name := range []string{"e2e.test", "ginkgo", "agnhost", "nnp", "busybox", "localhost.crt", "localhost.key"} {
		need.Built(tb, filepath.Join(dir, name), "conformance-suite", EnvBin)
	}
	if s.ReportDir == "" {
		s.ReportDir = tb.TempDir()
	}
	if err := os.MkdirAll(s.ReportDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	kubectl := filepath.Join(clusterBinDir(tb), "kubectl")
	need.Built(tb, kubectl, "cluster", kube.EnvBin)
	repoList := filepath.Join(tb.TempDir(), "repo-list.yaml")
	if err := writeRepoList(repoList, t.Pull); err != nil {
		tb.Fatal(err)
	}
	// The suite's kubectl specs leave kuberc files in TMPDIR: a directory of
	// the test's own keeps them from piling up in /tmp.
	env := append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoList, "TMPDIR="+tb.TempDir())

	ctx := context.Background()
	refs, err := listImages(ctx, e2eTest, env)
	if err != nil {
		tb.Fatal(err)
	}
	var res Result
	if res.Missing, err = pushImages(ctx, t.Registry, t.Pull, bins(dir), refs); err != nil {
		tb.Fatal(err)
	}
	notBuilt := filepath.Join(s.ReportDir, "images-not-built.txt")
	if err := os.WriteFile(notBuilt, []byte(strings.Join(res.Missing, "\n")+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("conformance: pushed %d of the suite's images to %s; the %d not built are in %s", len(refs)-len(res.Missing), t.Registry.Addr, len(res.Missing), notBuilt)

	start := time.Now()
	args := []string{"--procs", fmt.Sprint(s.Procs), "--timeout", s.Timeout.String(), "--no-color", "--succinct", "--focus", s.Focus}
	if s.Skip != "" { // an empty --skip would skip every spec
		args = append(args, "--skip", s.Skip)
	}
	args = append(args, e2eTest, "--",
		"--kubeconfig", t.Kubeconfig,
		"--kubectl-path", kubectl,
		"--provider", "skeleton",
		"--report-dir", s.ReportDir,
		"--dump-logs-on-failure=false",
		"--disable-log-dump",
	)
	report := filepath.Join(s.ReportDir, "junit_01.xml")
	if err := os.Remove(report); err != nil && !os.IsNotExist(err) {
		tb.Fatal(err)
	}
	logPath := filepath.Join(s.ReportDir, "e2e.log")
	out, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(ginkgo, args...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, s.ReportDir, out, out
	tb.Logf("conformance: %s (output in %s)", strings.Join(cmd.Args, " "), logPath)
	// ginkgo exits non-zero when a spec fails: the report says which.
	runErr := cmd.Run()
	res.Took = time.Since(start)
	if err := readReport(report, &res); err != nil {
		tb.Fatalf("conformance: the suite wrote no report (%v, ginkgo: %v): %s", err, runErr, tail(logPath))
	}
	if runErr != nil && len(res.Failed) == 0 {
		tb.Fatalf("conformance: ginkgo failed with no spec failed: %v: %s", runErr, tail(logPath))
	}
	return res
}

// binDir is where hack/build-conformance.sh put the suite.
func binDir(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv(EnvBin); dir != "" {
		return dir
	}
	root, err := repo.Root()
	if err != nil {
		tb.Fatalf("conformance: %v; set %s", err, EnvBin)
	}
	return filepath.Join(root, "_out", "conformance", "bin")
}

// clusterBinDir is where make cluster put the control plane and
// kubectl.
func clusterBinDir(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv(kube.EnvBin); dir != "" {
		return dir
	}
	root, err := repo.Root()
	if err != nil {
		tb.Fatalf("conformance: %v; set %s", err, kube.EnvBin)
	}
	return filepath.Join(root, "_out", "cluster", "bin")
}

// writeRepoList writes the suite's KUBE_TEST_REPO_LIST: every registry it
// names but the invalid and private ones (whose specs need exactly that)
// is a repository of addr.
func writeRepoList(path, addr string) error {
	var b strings.Builder
	for _, key := range []string{"promoterE2eRegistry", "buildImageRegistry", "gcEtcdRegistry", "gcRegistry",
		"sigStorageRegistry", "dockerLibraryRegistry", "cloudProviderGcpRegistry"} {
		fmt.Fprintf(&b, "%s: %s/%s\n", key, addr, strings.ToLower(strings.TrimSuffix(key, "Registry")))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// listImages is the images the suite names, as e2e.test --list-images
// prints them with env's KUBE_TEST_REPO_LIST.
func listImages(ctx context.Context, e2eTest string, env []string) ([]string, error) {
	cmd := exec.CommandContext(ctx, e2eTest, "--list-images")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-images: %w", e2eTest, err)
	}
	var refs []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(refs, l) {
			refs = append(refs, l)
		}
	}
	return refs, nil
}

// nodeReady returns an error until Node name is Ready.
func nodeReady(c *kube.Cluster, name string) error {
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("Node %s not Ready: %v", name, n.Status.Conditions)
}

// junitSuites is the part of ginkgo's JUnit report that Result needs.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Status  string `xml:"status,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// readReport adds the specs of the JUnit report at path to r, by their
// full names. ginkgo reports every spec that its focus and skip left out as
// skipped with the message "skipped"; a spec that skipped itself says why
// after it, and only those count.
func readReport(path string, r *Result) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, suite := range s.Suites {
		for _, tc := range suite.Cases {
			// The suite's own setup and reports ([SynchronizedBeforeSuite]…)
			// are cases too: they count only when they fail.
			name, spec := strings.CutPrefix(tc.Name, "[It] ")
			switch tc.Status {
			case "passed":
				if spec {
					r.Passed = append(r.Passed, name)
				}
			case "skipped", "pending":
				if spec && tc.Skipped != nil && tc.Skipped.Message != "skipped" {
					r.Skipped = append(r.Skipped, name)
				}
			default: // failed, panicked, timedout, interrupted, aborted
				r.Failed = append(r.Failed, name)
			}
		}
	}
	return nil
}

// tail is the end of the file at path, for failure messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return fmt.Sprintf("--- last lines of %s:\n%s", path, b)
}
