package machineconfig

import (
	"bytes"
	_ "embed"
)

// schemaJSON is generated from this package's types and doc comments by
// TestSchema (go test ./machineconfig -run TestSchema -update), which
// fails when it is out of date: embedding it keeps the generator and its
// dependencies out of the binaries that load configs.
//
//go:embed testdata/schema.json
var schemaJSON []byte

// SchemaID is the $id of the machine config's JSON Schema.
const SchemaID = "https://cairn.dev/schemas/v1alpha1/machine-config.json"

// Schema returns the JSON Schema (draft 2020-12) of the machine config,
// for editors to check a config as it is written. It checks the shape
// (fields, types, required fields); Validate checks the rest.
func Schema() []byte {
	return bytes.Clone(schemaJSON)
}
