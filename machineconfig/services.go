package machineconfig

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// Containerd configures the node's container runtime.
type Containerd struct {
	// Registries says how to reach registries: mirrors, plain HTTP, TLS
	// verification. A registry not listed is reached over HTTPS at its name.
	Registries []Registry `json:"registries,omitempty"`
}

// Registry is how containerd reaches one registry host.
type Registry struct {
	// Host is the registry as image names spell it, e.g. "docker.io" or
	// "10.0.2.2:5000".
	Host string `json:"host"`
	// Endpoints are mirrors tried in order, as URLs ("http://…" for plain
	// HTTP). Empty means https://Host.
	Endpoints []string `json:"endpoints,omitempty"`
	// InsecureSkipVerify turns off TLS verification for these endpoints.
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// Service is a system service run from an OCI image through containerd,
// supervised like the built-in ones.
type Service struct {
	Name    string   `json:"name"`
	Image   string   `json:"image"`
	Args    []string `json:"args,omitempty"`
	Env     []string `json:"env,omitempty"` // KEY=value
	Mounts  []Mount  `json:"mounts,omitempty"`
	Restart string   `json:"restart,omitempty"` // always (default), on-failure, never
	// Resources limit the service's cgroup (the container's processes).
	Resources Resources `json:"resources,omitzero"`
}

// Mount binds a host path into a service's container.
type Mount struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	ReadOnly    bool   `json:"readOnly,omitempty"`
}

// Restart policies of a Service.
const (
	RestartAlways    = "always"
	RestartOnFailure = "on-failure"
	RestartNever     = "never"
)

// reservedServices are the built-in services' names.
var reservedServices = map[string]bool{"containerd": true, "cairn-agent": true}

var serviceNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (s *Service) setDefaults() {
	if s.Restart == "" {
		s.Restart = RestartAlways
	}
}

func (v *validator) containerd(c *Containerd) {
	seen := map[string]string{}
	for i, r := range c.Registries {
		p := fmt.Sprintf("containerd.registries[%d]", i)
		switch {
		case r.Host == "":
			v.add(p+".host", "required")
		case strings.ContainsAny(r.Host, "/ \t") || strings.Contains(r.Host, "://"):
			v.add(p+".host", "%q is not a registry host[:port]", r.Host)
		case seen[r.Host] != "":
			v.add(p+".host", "%q is already configured by %s", r.Host, seen[r.Host])
		default:
			seen[r.Host] = p
		}
		for j, e := range r.Endpoints {
			if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
				v.add(fmt.Sprintf("%s.endpoints[%d]", p, j), "%q is not an http:// or https:// URL", e)
			}
		}
	}
}

func (v *validator) services(ss []Service) {
	names := map[string]string{}
	for i := range ss {
		s, p := &ss[i], fmt.Sprintf("services[%d]", i)
		switch {
		case s.Name == "":
			v.add(p+".name", "required")
		case !serviceNameRE.MatchString(s.Name):
			v.add(p+".name", "%q is not a lowercase DNS label", s.Name)
		case reservedServices[s.Name]:
			v.add(p+".name", "%q is a built-in service", s.Name)
		case names[s.Name] != "":
			v.add(p+".name", "%q is already used by %s", s.Name, names[s.Name])
		default:
			names[s.Name] = p
		}
		if s.Image == "" {
			v.add(p+".image", "required")
		} else if _, err := reference.ParseNormalizedNamed(s.Image); err != nil {
			v.add(p+".image", "%q is not an image reference: %v", s.Image, err)
		}
		for j, e := range s.Env {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
				v.add(fmt.Sprintf("%s.env[%d]", p, j), "%q is not KEY=value", e)
			}
		}
		for j, m := range s.Mounts {
			mp := fmt.Sprintf("%s.mounts[%d]", p, j)
			for _, f := range []struct{ name, val string }{{"source", m.Source}, {"destination", m.Destination}} {
				if !path.IsAbs(f.val) {
					v.add(mp+"."+f.name, "%q is not an absolute path", f.val)
				}
			}
		}
		switch s.Restart {
		case RestartAlways, RestartOnFailure, RestartNever:
		default:
			v.add(p+".restart", "%q is not one of always, on-failure, never", s.Restart)
		}
		v.resources(p+".resources", &s.Resources)
	}
}
