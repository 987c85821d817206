package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// When the test binary is started with runMainEnv set, it is the program
// under test: TestMain runs main instead of the tests.
const runMainEnv = "HELLO_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hello starts this test binary as the hello program with args.
func hello(t *testing.T, env []string, args ...string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start hello: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, out
}

// firstLine is the line hello must print first when started as cmd.
func firstLine(cmd *exec.Cmd, args string) string {
	return fmt.Sprintf("hello from cairn-test-image pid=%d args=%s", cmd.Process.Pid, args)
}

func TestOnce(t *testing.T) {
	cmd, stdout := hello(t, []string{"HELLO_ONCE=1"}, "a", "b c")
	out, err := io.ReadAll(stdout)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("hello with HELLO_ONCE=1: %v, want exit 0", err)
	}
	if want := firstLine(cmd, "a b c") + "\n"; string(out) != want {
		t.Errorf("hello with HELLO_ONCE=1 printed %q, want %q", out, want)
	}
}

func TestSIGTERM(t *testing.T) {
	cmd, stdout := hello(t, nil)
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("hello printed nothing: %v", lines.Err())
	}
	if got, want := lines.Text(), firstLine(cmd, ""); got != want {
		t.Errorf("first line = %q, want %q", got, want)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	err := cmd.Wait()
	if !deadline.Stop() {
		t.Fatal("hello did not exit within 10s of SIGTERM")
	}
	if err != nil {
		t.Fatalf("hello after SIGTERM: %v, want exit 0", err)
	}
	// A tick may land between the first line and the signal.
	if len(rest) == 0 || rest[len(rest)-1] != "bye" {
		t.Errorf("after SIGTERM hello printed %q, want it to end with \"bye\"", strings.Join(rest, "\n"))
	}
}

// TestServeAndDial runs one hello that serves and one that dials it: the
// dialer reports it reached the server, and blocked once it is gone.
func TestServeAndDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	server, _ := hello(t, []string{"HELLO_SERVE=" + addr})
	_, stdout := hello(t, []string{"HELLO_DIAL=" + addr})
	lines := bufio.NewScanner(stdout)
	seen := func(prefix string) {
		t.Helper()
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), prefix) {
				return
			}
		}
		t.Fatalf("no line %q: %v", prefix, lines.Err())
	}
	seen("reached " + addr)
	server.Process.Kill()
	seen("blocked " + addr)
}

// TestHTTP starts hello with HELLO_HTTP and wants its greeting, with the
// host's name, from an HTTP GET.
func TestHTTP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	hello(t, []string{"HELLO_HTTP=" + addr})
	host, _ := os.Hostname()
	var body []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET http://%s/: %v", addr, err)
		}
	}
	if want := "hello from " + host + "\n"; string(body) != want {
		t.Errorf("GET answered %q, want %q", body, want)
	}
}
