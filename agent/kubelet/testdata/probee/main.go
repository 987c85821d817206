// Command probee is a test workload for probes and hooks, which records
// in its output what it was asked, so that a test can read from the
// container's log what a probe or hook did and when.
//
// As a command:
//   - "probee check PATH" exits 0 if PATH exists and 1 if not: an exec
//     probe;
//   - "probee touch PATH" creates PATH: an exec hook;
//   - "probee sleep SECONDS" exits 0 after SECONDS: a slow exec probe;
//   - "probee seq FILE N" appends the line N to FILE if FILE holds the
//     lines 1 to N-1, and exits 1 otherwise: init containers that prove
//     their order;
//   - "probee write PATH TEXT" writes TEXT at the start of PATH, which is
//     there (a block device), and syncs it.
//
// Otherwise it runs until SIGTERM, printing "probee started" and then
// "bye" when it ends (with IGNORE_TERM=1 it prints "SIGTERM ignored" and
// runs on until SIGKILL), and:
//   - creates $TOUCH_FILE (if set), of $TOUCH_SIZE zero bytes (default
//     none), $TOUCH_AFTER seconds after its start, printing "touched PATH";
//   - holds $HOLD_BYTES (if set) of memory it wrote to, printing "holding
//     N bytes": a memory hog;
//   - serves HTTP on $LISTEN (such as ":8080", if set), printing
//     "http GET /path" as each request arrives. /sleep/N answers 200
//     after N seconds; /script/PATTERN answers its n-th request as the
//     n-th letter of PATTERN says, the last one for ever after it: s is
//     200, f is 500, t is 200 after 3 s (too late for a probe with a
//     shorter timeout), printing "script PATTERN #n: LETTER"; anything
//     else is 200;
//   - serves gRPC health (grpc.health.v1) on $GRPC_LISTEN (if set): the
//     server ("") is SERVING, the service "late" NOT_SERVING until
//     $GRPC_LATE_AFTER seconds after the start, then SERVING, printing
//     "grpc late SERVING".
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// held is the memory HOLD_BYTES asks to hold.
var held []byte

func main() {
	if len(os.Args) >= 2 {
		if code, ok := command(os.Args[1], os.Args[2:]); ok {
			os.Exit(code)
		}
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	fmt.Println("probee started")
	if n, _ := strconv.Atoi(os.Getenv("HOLD_BYTES")); n > 0 {
		held = make([]byte, n)
		for i := range held {
			held[i] = byte(i)
		}
		fmt.Println("holding", n, "bytes")
	}
	if f := os.Getenv("TOUCH_FILE"); f != "" {
		after, _ := strconv.Atoi(os.Getenv("TOUCH_AFTER"))
		size, _ := strconv.Atoi(os.Getenv("TOUCH_SIZE"))
		time.AfterFunc(time.Duration(after)*time.Second, func() {
			if err := os.WriteFile(f, make([]byte, size), 0o644); err != nil {
				fmt.Println(err)
				return
			}
			fmt.Println("touched", f)
		})
	}
	if addr := os.Getenv("LISTEN"); addr != "" {
		go func() { fmt.Println(http.ListenAndServe(addr, &server{counts: map[string]int{}})) }()
	}
	if addr := os.Getenv("GRPC_LISTEN"); addr != "" {
		go serveHealth(addr)
	}
	for range stop {
		if os.Getenv("IGNORE_TERM") != "1" {
			break
		}
		fmt.Println("SIGTERM ignored")
	}
	fmt.Println("bye")
}

// command runs probee as a command; ok says args named one.
func command(name string, args []string) (code int, ok bool) {
	fail := func(err error) (int, bool) {
		fmt.Println(err)
		return 1, true
	}
	switch {
	case name == "check" && len(args) == 1:
		if _, err := os.Stat(args[0]); err != nil {
			return fail(err)
		}
	case name == "touch" && len(args) == 1:
		if err := os.WriteFile(args[0], nil, 0o644); err != nil {
			return fail(err)
		}
	case name == "write" && len(args) == 2:
		// Into a file that is there, a block device: at its start, synced.
		f, err := os.OpenFile(args[0], os.O_WRONLY, 0)
		if err != nil {
			return fail(err)
		}
		if _, err := f.WriteAt([]byte(args[1]), 0); err != nil {
			return fail(err)
		}
		if err := f.Sync(); err != nil {
			return fail(err)
		}
		if err := f.Close(); err != nil {
			return fail(err)
		}
	case name == "sleep" && len(args) == 1:
		s, err := strconv.Atoi(args[0])
		if err != nil {
			return fail(err)
		}
		time.Sleep(time.Duration(s) * time.Second)
	case name == "seq" && len(args) == 2:
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return fail(err)
		}
		b, err := os.ReadFile(args[0])
		if err != nil && !os.IsNotExist(err) {
			return fail(err)
		}
		var want strings.Builder
		for i := 1; i < n; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
		if string(b) != want.String() {
			return fail(fmt.Errorf("seq %d: %s holds %q, want %q", n, args[0], b, want.String()))
		}
		f, err := os.OpenFile(args[0], os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fail(err)
		}
		if _, err := fmt.Fprintf(f, "%d\n", n); err != nil {
			return fail(err)
		}
		if err := f.Close(); err != nil {
			return fail(err)
		}
		fmt.Println("seq", n)
	default:
		return 0, false
	}
	return 0, true
}

// server answers HTTP as the package comment says.
type server struct {
	mu     sync.Mutex
	counts map[string]int // requests so far by /script/ pattern
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fmt.Println("http", r.Method, r.URL.Path)
	if d, ok := strings.CutPrefix(r.URL.Path, "/sleep/"); ok {
		n, _ := strconv.Atoi(d)
		time.Sleep(time.Duration(n) * time.Second)
		return
	}
	pattern, ok := strings.CutPrefix(r.URL.Path, "/script/")
	if !ok || pattern == "" {
		return
	}
	s.mu.Lock()
	s.counts[pattern]++
	n := s.counts[pattern]
	s.mu.Unlock()
	letter := pattern[min(n, len(pattern))-1]
	fmt.Printf("script %s #%d: %c\n", pattern, n, letter)
	switch letter {
	case 'f':
		w.WriteHeader(http.StatusInternalServerError)
	case 't':
		time.Sleep(3 * time.Second)
	}
}

// serveHealth serves gRPC health on addr.
func serveHealth(addr string) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus("late", healthpb.HealthCheckResponse_NOT_SERVING)
	after, _ := strconv.Atoi(os.Getenv("GRPC_LATE_AFTER"))
	time.AfterFunc(time.Duration(after)*time.Second, func() {
		h.SetServingStatus("late", healthpb.HealthCheckResponse_SERVING)
		fmt.Println("grpc late SERVING")
	})
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	fmt.Println(srv.Serve(lis))
}
