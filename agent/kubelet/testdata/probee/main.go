// Command probee is a test workload for probes and hooks. Run as "probee
// check PATH" it exits 0 if PATH exists and 1 if not: an exec probe; as
// "probee touch PATH" it creates PATH: an exec hook. Otherwise it creates
// $TOUCH_FILE (if set) $TOUCH_AFTER seconds after its start, serves HTTP
// 200 on $LISTEN (such as ":8080", if set), printing "http GET /path" for
// each request, and runs until SIGTERM.
package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "check" {
		if _, err := os.Stat(os.Args[2]); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "touch" {
		if err := os.WriteFile(os.Args[2], nil, 0o644); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	fmt.Println("probee started")
	if f := os.Getenv("TOUCH_FILE"); f != "" {
		after, _ := strconv.Atoi(os.Getenv("TOUCH_AFTER"))
		time.AfterFunc(time.Duration(after)*time.Second, func() {
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				fmt.Println(err)
				return
			}
			fmt.Println("touched", f)
		})
	}
	if addr := os.Getenv("LISTEN"); addr != "" {
		go func() {
			fmt.Println(http.ListenAndServe(addr, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				fmt.Println("http", r.Method, r.URL.Path)
			})))
		}()
	}
	<-stop
	fmt.Println("bye")
}
