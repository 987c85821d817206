package machineconfig

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	"github.com/invopop/jsonschema"
	jsonvalidator "github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/schema.json from the Go types")

// generateSchema reflects the machine config's JSON Schema from the types
// of this package, with their doc comments as descriptions.
func generateSchema(t *testing.T) []byte {
	t.Helper()
	r := &jsonschema.Reflector{
		// Types the JSON of which is not their Go kind's.
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			switch t {
			case reflect.TypeFor[Quantity]():
				return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{{Type: "string"}, {Type: "number"}}}
			case reflect.TypeFor[FileMode]():
				return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{
					{Type: "string", Pattern: "^0?[0-7]{1,3}$"},
					{Type: "integer", Minimum: "0", Maximum: "511"},
				}}
			case reflect.TypeFor[StaticPod]():
				return &jsonschema.Schema{Type: "object"}
			}
			return nil
		},
	}
	if err := r.AddGoComments("github.com/cairn-os/cairn/machineconfig", "."); err != nil {
		t.Fatalf("read the doc comments: %v", err)
	}
	s := r.Reflect(&Config{})
	s.ID = SchemaID
	conf := s.Definitions["Config"]
	conf.Properties.Value("apiVersion").Const = APIVersion
	conf.Properties.Value("kind").Const = KindMachineConfig
	// SetDefaults fills network in: a config may leave it out.
	conf.Required = slices.DeleteFunc(conf.Required, func(f string) bool { return f == "network" })
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// TestSchema wants the embedded schema, which `cairn config schema`
// prints, to be what the types say today.
func TestSchema(t *testing.T) {
	got := generateSchema(t)
	const golden = "testdata/schema.json"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(string(Schema()), string(got)); diff != "" {
		t.Errorf("%s is not the schema of the Go types (go test ./machineconfig -run TestSchema -update rewrites it); -old +new:\n%s", golden, diff)
	}
	for _, want := range []string{
		`"$schema": "https://json-schema.org/draft/2020-12/schema"`,
		`"description": "Hostname is the node's RFC 1123 hostname; it is required."`,
		`"additionalProperties": false`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("schema lacks %s", want)
		}
	}
}

// compileSchema compiles Schema() with a JSON Schema validator.
func compileSchema(t *testing.T) *jsonvalidator.Schema {
	t.Helper()
	doc, err := jsonvalidator.UnmarshalJSON(bytes.NewReader(Schema()))
	if err != nil {
		t.Fatalf("decode the schema: %v", err)
	}
	c := jsonvalidator.NewCompiler()
	if err := c.AddResource(SchemaID, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(SchemaID)
	if err != nil {
		t.Fatalf("compile the schema: %v", err)
	}
	return s
}

// checkSchema validates the YAML or JSON document data against s.
func checkSchema(s *jsonvalidator.Schema, data []byte) error {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	inst, err := jsonvalidator.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		return err
	}
	return s.Validate(inst)
}

// yamlBlockRE matches the YAML examples of a Markdown document.
var yamlBlockRE = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestSchemaExamples validates the repository's example configs against
// the schema: generated ones, and docs/machine-config.md's, each laid over
// a generated config as a merge patch, for most show only a part. Configs
// of the wrong shape are refused.
func TestSchemaExamples(t *testing.T) {
	s := compileSchema(t)
	var generated [][]byte
	for _, opts := range []GenerateOptions{
		{Hostname: "node-1"},
		{Hostname: "node-2", Interface: "eth0", Addresses: []string{"10.0.2.15/24"}, Gateway: "10.0.2.2", Nameservers: []string{"10.0.2.3"}},
	} {
		b, err := Generate(opts)
		if err != nil {
			t.Fatal(err)
		}
		data, err := b.Config.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := checkSchema(s, data); err != nil {
			t.Errorf("generated config %+v does not match the schema: %v\n%s", opts, err, data)
		}
		generated = append(generated, data)
	}
	base, err := yaml.YAMLToJSON(generated[0])
	if err != nil {
		t.Fatal(err)
	}

	docs, err := os.ReadFile("../docs/machine-config.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := yamlBlockRE.FindAllSubmatch(docs, -1)
	if len(blocks) < 4 {
		t.Fatalf("docs/machine-config.md has %d YAML examples, want at least 4", len(blocks))
	}
	for i, m := range blocks {
		patch, err := yaml.YAMLToJSON(m[1])
		if err != nil {
			t.Errorf("docs example %d is not YAML: %v\n%s", i, err, m[1])
			continue
		}
		doc, err := jsonpatch.MergePatch(base, patch)
		if err != nil {
			t.Errorf("docs example %d over a generated config: %v", i, err)
			continue
		}
		if err := checkSchema(s, doc); err != nil {
			t.Errorf("docs example %d does not match the schema: %v\n%s", i, err, m[1])
		}
		// Those that hold no placeholder certificate are valid too.
		if !bytes.Contains(m[1], []byte("BEGIN CERTIFICATE")) {
			if _, err := Parse(doc); err != nil {
				t.Errorf("docs example %d is not valid: %v\n%s", i, err, m[1])
			}
		}
	}

	for _, tc := range []struct{ name, patch string }{
		{"unknown field", `{"machine": {"hostnme": "x"}}`},
		{"port not a number", `{"machine": {"api": {"port": "fifty"}}}`},
		{"interfaces not a list", `{"network": {"interfaces": {"name": "eth0"}}}`},
		{"route without via", `{"network": {"interfaces": [{"name": "eth0", "routes": [{"to": "0.0.0.0/0"}]}]}}`},
		{"wrong kind", `{"kind": "Pod"}`},
		{"no machine", `{"machine": null}`},
		{"sysctl value not a string", `{"machine": {"sysctls": {"vm.swappiness": {"v": 1}}}}`},
		{"file without path", `{"machine": {"files": [{"content": "x"}]}}`},
		{"file mode not octal", `{"machine": {"files": [{"path": "/etc/x", "mode": "0999"}]}}`},
	} {
		doc, err := jsonpatch.MergePatch(base, []byte(tc.patch))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkSchema(s, doc); err == nil {
			t.Errorf("%s (%s): the schema accepts it, want it refused", tc.name, tc.patch)
		}
	}
}
