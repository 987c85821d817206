// Command echoexit is a test workload: it prints its arguments, then each
// environment variable whose name starts with CAIRN_ (sorted), one a line,
// and exits with the code in $EXIT_CODE (0 if unset).
//
// With ECHO_ID=1 it first prints "uid=U gid=G" and whether it could write
// a file in /: "root=writable" or "root=read-only". With IGNORE_TERM=1 it
// ignores SIGTERM and, after its output, prints "waiting" and never exits.
// With WRITE=PATH it writes $TEXT to the file PATH first (failing if it
// cannot); with LAST=TEXT it prints TEXT last, with no newline.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if os.Getenv("IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	if path := os.Getenv("WRITE"); path != "" {
		if err := os.WriteFile(path, []byte(os.Getenv("TEXT")), 0o644); err != nil {
			fmt.Println(err)
			os.Exit(3)
		}
	}
	if os.Getenv("ECHO_ID") == "1" {
		fmt.Printf("uid=%d gid=%d\n", os.Getuid(), os.Getgid())
		root := "writable"
		if err := os.WriteFile("/probe", nil, 0o644); errors.Is(err, syscall.EROFS) {
			root = "read-only"
		} else if err != nil {
			root = err.Error()
		}
		fmt.Printf("root=%s\n", root)
	}
	fmt.Printf("args=%s\n", strings.Join(os.Args[1:], " "))
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CAIRN_") {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	for _, kv := range env {
		fmt.Println(kv)
	}
	if os.Getenv("IGNORE_TERM") == "1" {
		fmt.Println("waiting")
		for {
			time.Sleep(time.Hour)
		}
	}
	fmt.Print(os.Getenv("LAST"))
	code, _ := strconv.Atoi(os.Getenv("EXIT_CODE"))
	os.Exit(code)
}
