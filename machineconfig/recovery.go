package machineconfig

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// RecoveryHostname is the hostname of a node in recovery whose config does
// not hold a usable one.
const RecoveryHostname = "cairn-recovery"

// Recovery is what a node can still run on when its machine config cannot
// be loaded (Load or Parse failed): the parts of the document that still
// decode and validate on their own, read leniently (unknown fields
// ignored), and defaults for the rest.
type Recovery struct {
	// Config holds the hostname, the API settings and the network of the
	// document where they are usable, else RecoveryHostname, no API
	// credentials and the default network (DHCP on the first link).
	// Nothing else is taken from the document: no containerd settings, no
	// services, no cluster. It is valid if API is true; if not, its only
	// problems are under machine.api.
	Config *Config
	// Salvaged lists the parts taken from the document, of
	// "machine.hostname", "machine.api" and "network".
	Salvaged []string
	// API reports whether Config.Machine.API holds usable credentials:
	// without them no management API can be served.
	API bool
}

// Recover builds the Recovery of a machine config document that does not
// load. data may be anything, even empty or not YAML at all.
func Recover(data []byte) *Recovery {
	cfg := &Config{APIVersion: APIVersion, Kind: KindMachineConfig, Machine: Machine{Hostname: RecoveryHostname}}
	cfg.SetDefaults()
	r := &Recovery{Config: cfg}

	// Each part is decoded on its own, so that a wrong type or a bad
	// value in one does not lose the others.
	var top, machine map[string]json.RawMessage
	if js, err := yaml.YAMLToJSON(data); err == nil {
		json.Unmarshal(js, &top)
		json.Unmarshal(top["machine"], &machine)
	}
	part := func(name string, raw json.RawMessage, v any, apply func(*Config)) {
		if raw == nil || json.Unmarshal(raw, v) != nil {
			return
		}
		trial := *cfg
		apply(&trial)
		trial.SetDefaults()
		if problemsUnder(trial.Validate(), name) {
			return
		}
		apply(cfg)
		cfg.SetDefaults()
		r.Salvaged = append(r.Salvaged, name)
	}
	var hostname string
	part("machine.hostname", machine["hostname"], &hostname, func(c *Config) { c.Machine.Hostname = hostname })
	var api API
	part("machine.api", machine["api"], &api, func(c *Config) { c.Machine.API = api })
	var network Network
	part("network", top["network"], &network, func(c *Config) { c.Network = network })
	r.API = !problemsUnder(cfg.Validate(), "machine.api")
	return r
}

// RecoverFile reads the machine config at path and returns its Recovery.
// A file that cannot be read recovers nothing, and the error says why.
func RecoverFile(path string) (*Recovery, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		err = fmt.Errorf("read machine config: %w", err)
	}
	return Recover(data), err
}

// problemsUnder reports whether err, a Validate result, has a problem with
// the field path or anything below it.
func problemsUnder(err error, path string) bool {
	if err == nil {
		return false
	}
	ve, ok := err.(*ValidationError)
	if !ok {
		return true
	}
	for _, fe := range ve.Errors {
		if fe.Path == path || strings.HasPrefix(fe.Path, path+".") || strings.HasPrefix(fe.Path, path+"[") {
			return true
		}
	}
	return false
}

// String says in one line what a node in recovery runs on.
func (r *Recovery) String() string {
	from := "nothing"
	if len(r.Salvaged) > 0 {
		from = strings.Join(r.Salvaged, ", ")
	}
	api := "no management API (no usable machine.api credentials)"
	if r.API {
		api = fmt.Sprintf("the management API on port %d", r.Config.Machine.API.Port)
	}
	return fmt.Sprintf("recovery mode: hostname %s, %s, network of %d interface(s); taken from the damaged config: %s",
		r.Config.Machine.Hostname, api, len(r.Config.Network.Interfaces), from)
}
