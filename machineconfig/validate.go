package machineconfig

import (
	"crypto/x509"
	"fmt"
	"regexp"
	"strings"
)

// FieldError is one problem with one field of a document.
type FieldError struct {
	// Path locates the field, e.g. network.interfaces[0].addresses[1].
	Path string
	Msg  string
}

// ValidationError lists every problem found in a document, in document
// order.
type ValidationError struct {
	// Doc names the document, e.g. "machine config".
	Doc    string
	Errors []FieldError
}

// Error lists the problems one per line.
func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid %s:", e.Doc)
	for _, fe := range e.Errors {
		fmt.Fprintf(&b, "\n  %s: %s", fe.Path, fe.Msg)
	}
	return b.String()
}

// validator collects field errors.
type validator struct {
	errs []FieldError
}

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// err returns the collected errors as a *ValidationError, or nil.
func (v *validator) err(doc string) error {
	if len(v.errs) == 0 {
		return nil
	}
	return &ValidationError{Doc: doc, Errors: v.errs}
}

// Validate reports every problem in c as a *ValidationError. It expects
// defaults to be applied (see SetDefaults) and does not look at the host.
func (c *Config) Validate() error {
	var v validator
	v.typeMeta(c.APIVersion, c.Kind, KindMachineConfig)
	v.machine(&c.Machine)
	v.network(&c.Network)
	v.containerd(&c.Containerd)
	v.services(c.Services)
	v.cluster(c.Cluster)
	return v.err("machine config")
}

func (v *validator) typeMeta(apiVersion, kind, wantKind string) {
	for _, f := range []struct{ path, got, want string }{
		{"apiVersion", apiVersion, APIVersion},
		{"kind", kind, wantKind},
	} {
		switch f.got {
		case f.want:
		case "":
			v.add(f.path, "required; use %s", f.want)
		default:
			v.add(f.path, "%q is not supported; use %s", f.got, f.want)
		}
	}
}

// hostnameRE matches RFC 1123 hostnames in lowercase, as Kubernetes
// node names require.
var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$`)

// validHostname reports whether s is a lowercase RFC 1123 hostname that
// fits the kernel's 64-byte limit.
func validHostname(s string) bool {
	if len(s) > 64 || !hostnameRE.MatchString(s) {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if len(label) > 63 {
			return false
		}
	}
	return true
}

func (v *validator) machine(m *Machine) {
	switch {
	case m.Hostname == "":
		v.add("machine.hostname", "required")
	case !validHostname(m.Hostname):
		v.add("machine.hostname", "%q is not a valid hostname: use at most 64 lowercase letters, digits, '-' and '.', each label starting and ending with a letter or digit", m.Hostname)
	}

	a := &m.API
	if a.Port < 1 || a.Port > 65535 {
		v.add("machine.api.port", "%d is out of range 1..65535", a.Port)
	}
	switch {
	case a.MetricsPort < 1 || a.MetricsPort > 65535:
		v.add("machine.api.metricsPort", "%d is out of range 1..65535", a.MetricsPort)
	case a.MetricsPort == a.Port:
		v.add("machine.api.metricsPort", "%d is machine.api.port already", a.MetricsPort)
	}
	ca := v.cert("machine.api.ca", a.CA)
	if ca != nil && !ca.IsCA {
		v.add("machine.api.ca", "not a CA certificate")
		ca = nil
	}
	cert := v.cert("machine.api.cert", a.Cert)
	if ca != nil && cert != nil && cert.CheckSignatureFrom(ca) != nil {
		v.add("machine.api.cert", "not signed by machine.api.ca")
	}
	v.key("machine.api.key", a.Key, cert, "machine.api.cert")
	v.resources("machine.resources.containerd", &m.Resources.Containerd)
	v.resources("machine.resources.agent", &m.Resources.Agent)
	v.staticPods(m.StaticPods, m.Hostname)

	v.sysctls(m.Sysctls)
	v.files(m.Files)

	v.time(&m.Time)
	v.kernel(&m.Kernel)
	v.install(&m.Install)
	v.shutdown(&m.Shutdown)
	v.eviction(&m.Eviction)
}

// cert checks that s holds a PEM certificate and returns it, or nil.
func (v *validator) cert(path, s string) *x509.Certificate {
	if s == "" {
		v.add(path, "required")
		return nil
	}
	c, err := parseCertPEM([]byte(s))
	if err != nil {
		v.add(path, "%v", err)
		return nil
	}
	return c
}

// key checks that s holds a PEM private key matching cert, if cert is not
// nil.
func (v *validator) key(path, s string, cert *x509.Certificate, certPath string) {
	if s == "" {
		v.add(path, "required")
		return
	}
	key, err := parseKeyPEM([]byte(s))
	if err != nil {
		v.add(path, "%v", err)
		return
	}
	if cert != nil && !keyMatches(cert, key) {
		v.add(path, "does not match %s", certPath)
	}
}
