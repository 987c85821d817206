//go:build bench

package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/test/agentnode"
	"github.com/cairn-os/cairn/test/kube"
)

// The Service dataplane side by side (make bench-proxy): upstream
// kube-proxy in nftables mode and Cairn's proxier (cmd/proxyagent: the
// agent's proxy.Run alone, on the agent's informers), each in a network
// namespace of its own, against one API server holding the same Services,
// in turn, twice each.
const (
	proxyBenchNS   = "proxybench"
	proxyBenchNode = "bench-node"
	proxyNodeIP    = "10.200.0.1"
	proxyPodCIDR   = "10.64.0.0/10"
	proxyEndpoints = 5
	// The probe Service's one endpoint, a listener on the namespace's
	// loopback: new connections to its ClusterIP measure the packet path.
	proxyProbeIP    = "10.63.0.2"
	proxyProbePort  = 8080
	proxyProbeConns = 1000
)

// proxyLive is how many Services are created while the proxy runs, at
// each size: nine tenths of it (9 000 at 10 000).
func proxyLive(services int) int { return services * 9 / 10 }

// proxyBenchSizes are the numbers of Services measured, from
// CAIRN_BENCH_PROXY_SIZES (say "1000"), by default 10, 1 000 and 10 000.
func proxyBenchSizes(b *testing.B) []int {
	v := os.Getenv("CAIRN_BENCH_PROXY_SIZES")
	if v == "" {
		return []int{10, 1000, 10000}
	}
	var sizes []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 10 || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
			b.Fatalf("CAIRN_BENCH_PROXY_SIZES=%q: want increasing numbers of Services, at least 10", v)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// A proxyContender is one of the proxies: how to start it and where its
// Service map is in the kernel.
type proxyContender struct {
	name  string
	start func(b *testing.B, ns string) *proc
	// table and family of the map whose elements are the ClusterIPs
	table  string
	family nftables.TableFamily
	set    string
}

func BenchmarkProxy(b *testing.B) {
	kubeProxy := clusterBinary(b, "kube-proxy")
	if _, err := exec.LookPath("nft"); err != nil {
		b.Fatalf("kube-proxy's nftables mode runs nft: install nftables (hack/deps.sh)")
	}
	agent := agentnode.BuildPackage(b, "./test/bench/cmd/proxyagent", "proxyagent")
	c := kube.Start(b, kube.Options{ServiceCIDR: "10.96.0.0/16"})
	contenders := []proxyContender{
		{name: "kube-proxy", table: "kube-proxy", family: nftables.TableFamilyIPv4, set: "service-ips",
			start: func(b *testing.B, ns string) *proc {
				return startInNS(b, ns, "kube-proxy", kubeProxy, "--kubeconfig", c.AdminKubeconfig, "--proxy-mode", "nftables",
					"--hostname-override", proxyBenchNode, "--cluster-cidr", proxyPodCIDR, "--conntrack-max-per-core", "0",
					"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256", "-v", "1")
			}},
		{name: "cairn", table: "cairn", family: nftables.TableFamilyINet, set: "service-ips4",
			start: func(b *testing.B, ns string) *proc {
				return startInNS(b, ns, "proxyagent", agent, "-kubeconfig", c.AdminKubeconfig, "-node-name", proxyBenchNode,
					"-node-ip", proxyNodeIP, "-cluster-cidr", proxyPodCIDR)
			}},
	}
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: proxyBenchNode},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: proxyNodeIP}}},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: proxyBenchNS}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	probe, err := createService(c.Client, "probe", 0, proxyProbeIP)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var report []string
		ips := map[netip.Addr]string{probe: "probe"}
		have := 0
		for _, services := range proxyBenchSizes(b) {
			start := time.Now()
			maps.Copy(ips, createServices(b, c.Client, "svc", have, services-have))
			have = services
			fmt.Printf("proxy: %d Services x %d endpoints in the API server (%.0fs to create)\n", services, proxyEndpoints, time.Since(start).Seconds())
			figs := map[string][]proxyFigures{}
			for round := range 2 {
				for _, ct := range contenders {
					f := runProxyRound(b, c.Client, strings.TrimPrefix(c.URL, "https://"), ct, ips, fmt.Sprintf("%s-%d-%d", ct.name, services, round), round)
					fmt.Printf("  %s\n", f.String(ct.name))
					figs[ct.name] = append(figs[ct.name], f)
				}
			}
			report = append(report, proxyReport(services, figs["cairn"], figs["kube-proxy"]))
		}
		fmt.Println(strings.Join(report, "\n"))
	}
}

// proxyFigures are one round's measurements of one proxy.
type proxyFigures struct {
	start, restart, change, liveLast time.Duration
	liveCPU                          time.Duration
	rss, peak                        int64
	conn50, conn99                   time.Duration // new connection to a ClusterIP: connect and first byte
}

func (f proxyFigures) String(name string) string {
	return fmt.Sprintf("%-10s start %6.2fs  restart %6.2fs  one endpoint %7.1fms  live create: last -> programmed %6.2fs, CPU %5.1fs  RSS %4d MB, peak %4d MB  new connection p50 %4dus p99 %5dus",
		name, f.start.Seconds(), f.restart.Seconds(), float64(f.change.Microseconds())/1000, f.liveLast.Seconds(), f.liveCPU.Seconds(), f.rss>>20, f.peak>>20,
		f.conn50.Microseconds(), f.conn99.Microseconds())
}

// proxyReport is the table of one size: the median of the rounds (of two,
// the mean) for each figure, and Cairn's over kube-proxy's.
func proxyReport(services int, cairn, kp []proxyFigures) string {
	med := func(fs []proxyFigures, get func(proxyFigures) float64) float64 {
		var s float64
		for _, f := range fs {
			s += get(f)
		}
		return s / float64(len(fs))
	}
	rows := []struct {
		what, unit string
		get        func(proxyFigures) float64
	}{
		{"start with the Services present, empty table -> programmed", "s", func(f proxyFigures) float64 { return f.start.Seconds() }},
		{"restart with its own table, one Service deleted meanwhile -> programmed", "s", func(f proxyFigures) float64 { return f.restart.Seconds() }},
		{"one endpoint added -> committed", "ms", func(f proxyFigures) float64 { return float64(f.change.Microseconds()) / 1000 }},
		{fmt.Sprintf("create %d live: last create -> programmed", proxyLive(services)), "s", func(f proxyFigures) float64 { return f.liveLast.Seconds() }},
		{"CPU-seconds during that live create", "s", func(f proxyFigures) float64 { return f.liveCPU.Seconds() }},
		{"RSS settled", "MB", func(f proxyFigures) float64 { return float64(f.rss) / (1 << 20) }},
		{"RSS peak", "MB", func(f proxyFigures) float64 { return float64(f.peak) / (1 << 20) }},
		{fmt.Sprintf("new connection to a ClusterIP, connect + first byte, p50 of %d", proxyProbeConns), "us", func(f proxyFigures) float64 { return float64(f.conn50.Microseconds()) }},
		{"  and p99", "us", func(f proxyFigures) float64 { return float64(f.conn99.Microseconds()) }},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "proxy, %d Services x %d endpoints (mean of %d rounds)\n", services, proxyEndpoints, len(cairn))
	fmt.Fprintf(&sb, "  %-74s %12s %12s %8s\n", "figure", "kube-proxy", "cairn", "ratio")
	for _, r := range rows {
		k, c := med(kp, r.get), med(cairn, r.get)
		ratio := "-"
		if k > 0 {
			ratio = fmt.Sprintf("%.2f", c/k)
		}
		fmt.Fprintf(&sb, "  %-74s %10.2f%-2s %10.2f%-2s %8s\n", r.what, k, r.unit, c, r.unit, ratio)
	}
	return sb.String()
}

// endpointSeq numbers the endpoints added, each a new address.
var endpointSeq atomic.Int32

// startInNS starts a command in the network namespace ns.
func startInNS(b *testing.B, ns, name, bin string, args ...string) *proc {
	log := filepath.Join(b.TempDir(), name+".log")
	return startProc(b, name, log, exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...), nil)
}

// runProxyRound runs one proxy through the figures in a new network
// namespace; ips are the ClusterIPs of the Services present.
func runProxyRound(b *testing.B, client kubernetes.Interface, apiAddr string, ct proxyContender, ips map[netip.Addr]string, tag string, round int) proxyFigures {
	ns := "cairn-proxybench-" + tag
	run(b, "ip", "netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	run(b, "ip", "-n", ns, "link", "set", "lo", "up")
	run(b, "ip", "-n", ns, "link", "add", "bench0", "type", "veth", "peer", "name", "bench1")
	run(b, "ip", "-n", ns, "addr", "add", proxyNodeIP+"/24", "dev", "bench0")
	run(b, "ip", "-n", ns, "link", "set", "bench0", "up")
	run(b, "ip", "-n", ns, "route", "add", "10.96.0.0/16", "dev", "bench0")
	run(b, "ip", "-n", ns, "addr", "add", proxyProbeIP+"/32", "dev", "lo")
	h, err := netns.GetFromName(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	forwardAPI(b, h, apiAddr)
	serveProbe(b, h)
	apiSvc, err := client.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	apiIP, _ := netip.ParseAddr(apiSvc.Spec.ClusterIP) // in the map if it has endpoints
	kernel := &serviceMap{fd: int(h), table: ct.table, family: ct.family, set: ct.set}
	gen, err := dialGeneration(int(h))
	if err != nil {
		b.Fatal(err)
	}
	defer gen.close()
	want := func(ips map[netip.Addr]string) func() (bool, error) {
		return func() (bool, error) {
			got, err := kernel.ips()
			if err != nil {
				return false, nil // the table is not there yet
			}
			for ip := range ips {
				if !got[ip] {
					return false, nil
				}
			}
			for ip := range got {
				if _, ok := ips[ip]; !ok && ip != apiIP {
					return false, nil
				}
			}
			return true, nil
		}
	}
	var f proxyFigures

	// Start with an empty table.
	t0 := time.Now()
	p := ct.start(b, ns)
	f.start = waitFor(b, p, t0, gen, 10*time.Minute, want(ips))

	// Restart over its own table, with a Service deleted while it was down.
	p.stop()
	victim := fmt.Sprintf("svc-%d", 1+round)
	deleteService(b, client, victim)
	rest := make(map[netip.Addr]string, len(ips))
	for ip, name := range ips {
		if name != victim {
			rest[ip] = name
		}
	}
	t0 = time.Now()
	p = ct.start(b, ns)
	f.restart = waitFor(b, p, t0, gen, 10*time.Minute, want(rest))
	time.Sleep(5 * time.Second) // settle after the first sync
	if f.rss, f.peak, err = p.mem(); err != nil {
		b.Fatal(err)
	}
	var probeIP netip.Addr
	for ip, name := range ips {
		if name == "probe" {
			probeIP = ip
		}
	}
	if f.conn50, f.conn99, err = connectLatency(h, netip.AddrPortFrom(probeIP, 80), proxyProbeConns); err != nil {
		b.Fatalf("%s: %v\n%s", ct.name, err, p.tail())
	}

	// One endpoint added to one Service: the first commit that touches it.
	mon, gens := monitor(b, int(h))
	t0 = time.Now()
	addEndpoint(b, client, "svc-7", fmt.Sprintf("10.127.0.%d", endpointSeq.Add(1)))
	f.change = waitCommit(b, p, gens, t0, "/svc-7/")
	mon.Close()

	// Services created while it runs.
	cpu0, err := p.cpu()
	if err != nil {
		b.Fatal(err)
	}
	live := createServices(b, client, "live-"+tag, 0, proxyLive(len(ips)))
	t0 = time.Now()
	all := maps.Clone(rest)
	maps.Copy(all, live)
	f.liveLast = waitFor(b, p, t0, gen, 10*time.Minute, want(all))
	cpu1, err := p.cpu()
	if err != nil {
		b.Fatal(err)
	}
	f.liveCPU = cpu1 - cpu0
	p.stop()
	deleteServices(b, client, "live-"+tag)
	recreateService(b, client, victim, ips)
	return f
}

// forwardAPI makes the API server, at addr on the host's loopback, answer
// at the same address in the namespace h too: a listener there whose
// connections are forwarded, so that no traffic leaves loopback.
func forwardAPI(b *testing.B, h netns.NsHandle, addr string) {
	acceptIn(b, h, addr, func(in net.Conn) {
		go func() {
			defer in.Close()
			out, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer out.Close()
			go io.Copy(out, in)
			io.Copy(in, out)
		}()
	})
}

// acceptIn listens on addr in the namespace h until the benchmark ends,
// and hands each connection to handle.
func acceptIn(b *testing.B, h netns.NsHandle, addr string, handle func(net.Conn)) {
	b.Helper()
	l, err := listenIn(h, addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
}

// listenIn listens on addr in the namespace h.
func listenIn(h netns.NsHandle, addr string) (l net.Listener, err error) {
	err = inNS(h, func() error {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// inNS runs fn on a thread that enters the namespace h for it only: the
// sockets fn opens are the namespace's.
func inNS(h netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := netns.Get()
	if err != nil {
		return err
	}
	defer host.Close()
	if err := netns.Set(h); err != nil {
		return err
	}
	defer func() {
		if err := netns.Set(host); err != nil {
			panic(fmt.Sprintf("return to the host's network namespace: %v", err)) // the thread is lost
		}
	}()
	return fn()
}

func run(b *testing.B, name string, args ...string) {
	b.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// waitFor waits until done says so, and returns the time since t0 when
// the kernel's table first was as done wants; it fails if p exits or
// timeout passes. done reads the kernel's table (10 000 elements take a
// while), so it runs only when the table may have changed: when the
// namespace's nftables generation, polled every few milliseconds, moved.
func waitFor(b *testing.B, p *proc, t0 time.Time, gen *generation, timeout time.Duration, done func() (bool, error)) time.Duration {
	b.Helper()
	var last uint32
	checked := false
	for {
		g, err := gen.read()
		if err != nil {
			b.Fatal(err)
		}
		if !checked || g != last {
			seen := time.Since(t0)
			ok, err := done()
			if err != nil {
				b.Fatal(err)
			}
			after, err := gen.read()
			if err != nil {
				b.Fatal(err)
			}
			if after != g { // a commit while done read: it may be the one
				seen = time.Since(t0)
			}
			if ok {
				return seen
			}
			last, checked = g, true
		}
		if err := p.running(); err != nil {
			b.Fatal(err)
		}
		if time.Since(t0) > timeout {
			b.Fatalf("%s: not programmed after %v\n%s", p.name, timeout, p.tail())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// generation reads a namespace's nftables generation, which every
// committed transaction moves: one small netlink request.
type generation struct{ c *netlink.Conn }

func dialGeneration(fd int) (*generation, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: fd})
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink connection: %w", err)
	}
	return &generation{c}, nil
}

func (g *generation) close() { g.c.Close() }

func (g *generation) read() (uint32, error) {
	msgs, err := g.c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("read nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("read nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("read nftables generation: no NFTA_GEN_ID in the answer")
}

// serviceMap reads the ClusterIPs in a proxy's map of Services.
type serviceMap struct {
	fd     int
	table  string
	family nftables.TableFamily
	set    string
}

func (m *serviceMap) ips() (map[netip.Addr]bool, error) {
	c, err := nftables.New(nftables.WithNetNSFd(m.fd))
	if err != nil {
		return nil, err
	}
	t := &nftables.Table{Name: m.table, Family: m.family}
	s, err := c.GetSetByName(t, m.set)
	if err != nil {
		return nil, err
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Addr]bool, len(elems))
	for _, e := range elems {
		if len(e.Key) >= 4 {
			out[netip.AddrFrom4([4]byte(e.Key[:4]))] = true
		}
	}
	return out, nil
}

// monitor watches the nftables transactions of the namespace open as fd.
func monitor(b *testing.B, fd int) (*nftables.Monitor, chan *nftables.MonitorEvents) {
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		b.Fatal(err)
	}
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(4096))
	gens, err := c.AddGenerationalMonitor(mon)
	if err != nil {
		b.Fatal(err)
	}
	return mon, gens
}

// waitCommit returns the time from t0 to the first transaction that
// touches a chain whose name has what.
func waitCommit(b *testing.B, p *proc, gens chan *nftables.MonitorEvents, t0 time.Time, what string) time.Duration {
	b.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case g, ok := <-gens:
			if !ok {
				b.Fatal("nftables monitor closed")
			}
			for _, ev := range g.Changes {
				var chain string
				switch d := ev.Data.(type) {
				case *nftables.Chain:
					chain = d.Name
				case *nftables.Rule:
					chain = d.Chain.Name
				}
				if strings.Contains(chain, what) {
					return time.Since(t0)
				}
			}
		case <-timeout:
			b.Fatalf("%s: no transaction touching %q within a minute\n%s", p.name, what, p.tail())
		}
	}
}

// createServices creates n Services prefix-i (i from first) with
// EndpointSlices of proxyEndpoints ready endpoints each, and returns their
// ClusterIPs.
func createServices(b *testing.B, client kubernetes.Interface, prefix string, first, n int) map[netip.Addr]string {
	b.Helper()
	var (
		mu   sync.Mutex
		ips  = make(map[netip.Addr]string, n)
		errs []error
		wg   sync.WaitGroup
		next = make(chan int)
	)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				name := fmt.Sprintf("%s-%d", prefix, i)
				ip, err := createService(client, name, i, "")
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ips[ip] = name
				}
				mu.Unlock()
			}
		})
	}
	for i := first; i < first+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("create Services: %v (and %d more)", errs[0], len(errs)-1)
	}
	return ips
}

// createService creates the Service name, number i, with its slice: its
// endpoints are addresses elsewhere, numbered by i, or the one address
// probe if given.
func createService(client kubernetes.Interface, name string, i int, probe string) (netip.Addr, error) {
	ctx := context.Background()
	svc, err := client.CoreV1().Services(proxyBenchNS).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, err
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return netip.Addr{}, err
	}
	var addrs []string
	for j := range proxyEndpoints {
		addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d", 64+j, (i>>8)&0xff, i&0xff))
	}
	if probe != "" {
		addrs = []string{probe}
	}
	var eps []discovery.Endpoint
	for _, a := range addrs {
		eps = append(eps, discovery.Endpoint{
			Addresses:  []string{a},
			Conditions: discovery.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr("elsewhere"),
		})
	}
	_, err = client.DiscoveryV1().EndpointSlices(proxyBenchNS).Create(ctx, &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr[int32](8080)}},
		Endpoints:   eps,
	}, metav1.CreateOptions{})
	return ip, err
}

func ptr[T any](v T) *T { return &v }

func deleteService(b *testing.B, client kubernetes.Interface, name string) {
	b.Helper()
	ctx := context.Background()
	if err := client.CoreV1().Services(proxyBenchNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := client.DiscoveryV1().EndpointSlices(proxyBenchNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
}

// recreateService creates the deleted Service name again, and puts its new
// ClusterIP in ips.
func recreateService(b *testing.B, client kubernetes.Interface, name string, ips map[netip.Addr]string) {
	b.Helper()
	for ip, n := range ips {
		if n == name {
			delete(ips, ip)
		}
	}
	var i int
	fmt.Sscanf(name, "svc-%d", &i)
	ip, err := createService(client, name, i, "")
	if err != nil {
		b.Fatal(err)
	}
	ips[ip] = name
}

// deleteServices deletes the Services and slices named prefix-*.
func deleteServices(b *testing.B, client kubernetes.Interface, prefix string) {
	b.Helper()
	ctx := context.Background()
	svcs, err := client.CoreV1().Services(proxyBenchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for _, s := range svcs.Items {
		if strings.HasPrefix(s.Name, prefix+"-") {
			names = append(names, s.Name)
		}
	}
	var wg sync.WaitGroup
	next := make(chan string)
	for range 16 {
		wg.Go(func() {
			for name := range next {
				client.CoreV1().Services(proxyBenchNS).Delete(ctx, name, metav1.DeleteOptions{})
				client.DiscoveryV1().EndpointSlices(proxyBenchNS).Delete(ctx, name, metav1.DeleteOptions{})
			}
		})
	}
	for _, n := range names {
		next <- n
	}
	close(next)
	wg.Wait()
}

// addEndpoint adds an endpoint to the slice of Service name.
func addEndpoint(b *testing.B, client kubernetes.Interface, name, addr string) {
	b.Helper()
	ctx := context.Background()
	sl, err := client.DiscoveryV1().EndpointSlices(proxyBenchNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{Addresses: []string{addr}, Conditions: discovery.EndpointConditions{Ready: ptr(true)}, NodeName: ptr("elsewhere")})
	if _, err := client.DiscoveryV1().EndpointSlices(proxyBenchNS).Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// serveProbe answers each connection to the probe's endpoint, in the
// namespace h, with one byte.
func serveProbe(b *testing.B, h netns.NsHandle) {
	acceptIn(b, h, net.JoinHostPort(proxyProbeIP, strconv.Itoa(proxyProbePort)), func(c net.Conn) {
		c.Write([]byte{1})
		c.Close()
	})
}

// connectLatency opens n connections to addr, one after the other, from
// the namespace h, and returns the median and the 99th percentile of the
// time from connect to the first byte read.
func connectLatency(h netns.NsHandle, addr netip.AddrPort, n int) (p50, p99 time.Duration, err error) {
	took := make([]time.Duration, 0, n)
	err = inNS(h, func() error {
		buf := make([]byte, 1)
		for range n {
			t0 := time.Now()
			c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
			if err != nil {
				return fmt.Errorf("connect to the probe Service at %s: %w", addr, err)
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = io.ReadFull(c, buf)
			c.Close()
			if err != nil {
				return fmt.Errorf("read from the probe Service at %s: %w", addr, err)
			}
			took = append(took, time.Since(t0))
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	slices.Sort(took)
	return took[n/2], took[n*99/100], nil
}
