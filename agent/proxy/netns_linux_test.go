package proxy

// Helpers for the tests that run the dataplane for real: network namespaces
// made with ip(8), veth pairs between them, servers inside them. Each test
// builds its own namespaces (named after the test binary's pid), and
// t.Cleanup removes them, which removes their links and nftables tables with
// them. No namespace has a default route out of the test's own namespaces,
// and every address is in 198.18.0.0/15 (RFC 2544 benchmarking) or fd00::/8,
// inside those namespaces only.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"

	"github.com/vishvananda/netns"
)

var nsSeq atomic.Int32

// needRoot skips a test that needs root and namespaces where they are not
// to be had (the tests are meant to run, as root, in make test).
func needRoot(t testing.TB) {
	t.Helper()
	need.Root(t, "network namespaces")
	need.Tool(t, "ip", "iproute2")
}

type netNS struct {
	name string
	path string
	h    netns.NsHandle
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNS creates a network namespace with its loopback up; t.Cleanup
// deletes it.
func newNS(t testing.TB, role string) *netNS {
	t.Helper()
	name := fmt.Sprintf("cairnpx-%d-%d-%s", os.Getpid(), nsSeq.Add(1), role)
	ipCmd(t, "netns", "add", name)
	ns := &netNS{name: name, path: "/run/netns/" + name}
	t.Cleanup(func() {
		if ns.h.IsOpen() {
			ns.h.Close()
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", name, err, out)
		}
	})
	h, err := netns.GetFromPath(ns.path)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	ns.h = h
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
	return ns
}

// do runs fn on a thread that is inside ns. Sockets made in fn stay in ns
// afterwards, whichever thread uses them.
func (ns *netNS) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns.h); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns.name, err)
			return
		}
		errc <- fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		} // else the thread dies with the goroutine, still locked
	}()
	return <-errc
}

func (ns *netNS) sysctl(t *testing.T, key, value string) {
	t.Helper()
	err := ns.do(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
	})
	if err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, ns.name, err)
	}
}

// link connects a and b with a veth pair: aName/aAddr in a, bName/bAddr in
// b (addresses with prefix length; none if empty).
func link(t *testing.T, a *netNS, aName, aAddr string, b *netNS, bName, bAddr string) {
	t.Helper()
	ipCmd(t, "-n", a.name, "link", "add", aName, "type", "veth", "peer", "name", bName, "netns", b.name)
	for _, x := range []struct {
		ns        *netNS
		dev, addr string
	}{{a, aName, aAddr}, {b, bName, bAddr}} {
		switch {
		case x.addr == "":
		case strings.Contains(x.addr, ":"):
			ipCmd(t, "-n", x.ns.name, "-6", "addr", "add", x.addr, "dev", x.dev, "nodad")
		default:
			ipCmd(t, "-n", x.ns.name, "addr", "add", x.addr, "dev", x.dev)
		}
		ipCmd(t, "-n", x.ns.name, "link", "set", x.dev, "up")
	}
}

// serve starts, inside ns, an HTTP server on :8080 and a UDP server on
// :5353 that both answer "name remote-address". They stop at cleanup.
func serve(t *testing.T, ns *netNS, name string) {
	t.Helper()
	var l net.Listener
	var pc net.PacketConn
	err := ns.do(func() error {
		var err error
		if l, err = net.Listen("tcp", ":8080"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ":5353")
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", ns.name, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.RemoteAddr)
	}), ReadHeaderTimeout: 5 * time.Second}
	srv.SetKeepAlivesEnabled(false)
	go srv.Serve(l)
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(name+" "+from.String()), from)
		}
	}()
	t.Cleanup(func() { srv.Close(); pc.Close() })
}

// reply is what a backend answered: who it is and whom it saw.
type reply struct {
	backend string
	from    netip.AddrPort
}

func parseReply(s string) (reply, error) {
	name, from, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok {
		return reply{}, fmt.Errorf("bad reply %q", s)
	}
	ap, err := netip.ParseAddrPort(from)
	if err != nil {
		return reply{}, fmt.Errorf("bad reply %q: %w", s, err)
	}
	return reply{name, ap}, nil
}

// httpGet opens a new TCP connection from ns to addr and does one request.
func httpGet(ns *netNS, addr string, timeout time.Duration) (reply, error) {
	var c net.Conn
	err := ns.do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	if err != nil {
		return reply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return parseReply(string(body))
}

// udpAsk sends one datagram from ns (from local port lport, 0: any) to
// addr and waits for the answer.
func udpAsk(ns *netNS, lport int, addr string, timeout time.Duration) (reply, error) {
	var c *net.UDPConn
	err := ns.do(func() error {
		raddr, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return err
		}
		c, err = net.DialUDP("udp", &net.UDPAddr{Port: lport}, raddr)
		return err
	})
	if err != nil {
		return reply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("hi")); err != nil {
		return reply{}, err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return reply{}, err
	}
	return parseReply(string(buf[:n]))
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// eventually polls cond every 20ms until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: still not so after 10s: %v", what, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
