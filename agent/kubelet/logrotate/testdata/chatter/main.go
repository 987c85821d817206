// Command chatter is a test workload that fills its log: it prints a
// numbered line of about 200 bytes every millisecond until SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	pad := strings.Repeat("x", 180)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-stop:
			fmt.Println("bye")
			return
		case <-t.C:
			fmt.Printf("line %d %s\n", n, pad)
		}
	}
}
