// Command coredns is CoreDNS with the plugins a cluster's DNS needs and
// nothing else: cairn qemu cluster deploys it as the cluster's DNS (see
// qemu/cluster). Built by hack/build-coredns.sh.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins' order in a server block, as in CoreDNS's plugin.cfg.
func init() {
	dnsserver.Directives = []string{
		"reload", "health", "ready", "errors", "log", "loadbalance", "cache", "kubernetes",
	}
}

func main() { coremain.Run() }
