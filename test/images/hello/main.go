// Command hello is the smallest useful container workload for Cairn's tests.
// test/registry builds it into a one-layer image that a node's containerd
// pulls from a registry on the test host, so a test can tell from the
// container's output that the image was pulled, started and stopped.
//
// On start it prints exactly one line,
//
//	hello from cairn-test-image pid=<pid> args=<args joined by space>
//
// then prints "tick <n>" every 5 seconds until SIGTERM (or SIGINT), when it
// prints "bye" and exits 0. It handles the signals itself because, as PID 1
// of a container, it would otherwise ignore them. With HELLO_ONCE=1 in its
// environment it exits 0 right after the first line, for checks that only
// need to run the binary. HELLO_SERVE=ADDR greets each TCP connection
// with "hello"; HELLO_HTTP=ADDR answers HTTP requests with "hello from
// <hostname>"; HELLO_DIAL=ADDR connects to ADDR every second and says
// whether it got through.
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const tickEvery = 5 * time.Second

func main() {
	// Subscribe before the first line, so that a signal sent by a test
	// that has seen the line is never missed.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)

	fmt.Printf("hello from cairn-test-image pid=%d args=%s\n", os.Getpid(), strings.Join(os.Args[1:], " "))
	if os.Getenv("HELLO_ONCE") == "1" {
		return
	}

	if addr := os.Getenv("HELLO_SERVE"); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("serve:", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, "hello")
				c.Close()
			}
		}()
	}
	if addr := os.Getenv("HELLO_DIAL"); addr != "" {
		go dial(addr)
	}
	if addr := os.Getenv("HELLO_HTTP"); addr != "" {
		go serveHTTP(addr)
	}

	ticker := time.NewTicker(tickEvery)
	defer ticker.Stop()
	for n := 1; ; n++ {
		select {
		case <-ticker.C:
			fmt.Printf("tick %d\n", n)
		case <-stop:
			fmt.Println("bye")
			return
		}
	}
}

// serveHTTP answers every HTTP request on addr with a line naming this
// host: a pod's name, so that a client sees which pod answered.
func serveHTTP(addr string) {
	host, _ := os.Hostname()
	err := http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", host)
	}))
	fmt.Println("serve HTTP:", err)
	os.Exit(1)
}

// dial connects to addr every second and says whether it got through.
func dial(addr string) {
	for ; ; time.Sleep(time.Second) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			fmt.Printf("blocked %s: %v\n", addr, err)
			continue
		}
		c.Close()
		fmt.Printf("reached %s\n", addr)
	}
}
