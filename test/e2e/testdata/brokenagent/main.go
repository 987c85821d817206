// Command brokenagent stands in for cairn-agent in the UKI of a broken
// upgrade: it exits at once, so that the node never becomes healthy and
// the upgrade rolls back by itself.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "cairn-agent of a UKI built broken for the rollback test: exiting")
	os.Exit(1)
}
