package machineconfig

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Time configures how the node keeps its clock.
type Time struct {
	// Servers are the NTP servers init keeps the clock in step with, each
	// a host name or IP address, with :port when not 123 (e.g.
	// time.example.com, 192.0.2.1, [2001:db8::1]:1123). They are tried in
	// order; the first that answers sets the clock. None (the default)
	// leaves the clock as the kernel set it from the machine's real-time
	// clock.
	Servers []string `json:"servers,omitempty"`
}

// checkNTPServer says what is wrong with s as an NTP server, or "".
func checkNTPServer(s string) string {
	host := s
	if h, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "has a port out of range 1..65535"
		}
		host = h
	} else if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		return "is not HOST or HOST:PORT (an IPv6 address with a port is written [ADDRESS]:PORT)"
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	if !validDNSName(strings.TrimSuffix(host, ".")) {
		return "is not a host name or IP address"
	}
	return ""
}

func (v *validator) time(t *Time) {
	seen := map[string]string{}
	for i, s := range t.Servers {
		p := fmt.Sprintf("machine.time.servers[%d]", i)
		switch msg := checkNTPServer(s); {
		case s == "":
			v.add(p, "empty: give a host name or IP address")
		case msg != "":
			v.add(p, "%q %s", s, msg)
		case seen[strings.ToLower(s)] != "":
			v.add(p, "%q is %s already", s, seen[strings.ToLower(s)])
		default:
			seen[strings.ToLower(s)] = p
		}
	}
}
