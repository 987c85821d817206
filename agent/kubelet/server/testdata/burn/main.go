// Command burn is a test workload for the resource stats: it holds
// $HOLD_MIB MiB of memory (every page touched, so it counts in the working
// set) and keeps one CPU busy half of the time, until it is killed.
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"
)

func main() {
	mib, err := strconv.Atoi(os.Getenv("HOLD_MIB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "HOLD_MIB must be a number of MiB")
		os.Exit(2)
	}
	held := make([]byte, mib<<20)
	for i := range held {
		held[i] = byte(i)
	}
	fmt.Printf("holding %d MiB\n", mib)
	// Half a core: the test needs a rate above zero, not a full CPU of a
	// shared machine.
	for {
		end := time.Now().Add(5 * time.Millisecond)
		for time.Now().Before(end) {
		}
		time.Sleep(5 * time.Millisecond)
		runtime.KeepAlive(held)
	}
}
