// Package incluster names the commands of the project's image and picks one from the command line. The image holds
// one binary, Binary, with each of Links pointing at it: what it was started as (argv[0]) selects the command, and
// so does a first argument naming one (`kube-gpu-stack validator wait ...`), so each command works both ways. Each
// command keeps its own package; hooks/cmd/in-cluster maps the name to it.
//
// This package imports no command on purpose. A cgo build that links go-nvml (the validator's NVML probe) together
// with k8s.io/cli-runtime (kustomize, which imports the plugin package, and plugin makes the Go linker ask for
// immediate binding) only starts with lazy binding: go build -ldflags=-extldflags=-Wl,-z,lazy, as NVIDIA documents
// for go-nvml. The image is built without cgo and is not affected; tests of this package must run either way.
package incluster

import (
	"path/filepath"
	"slices"
)

const (
	// Binary is the image's one executable: the release-level hooks (hooks/release/stackcli), called by this name.
	Binary = "kube-gpu-stack"
	// Validator is the per-node checks (hooks/node/validatorcli).
	Validator = "validator"
	// DriverManager is the node-local driver changes (hooks/node/drivermanagercli).
	DriverManager = "driver-manager"
	// MainPackage builds Binary, relative to the module root.
	MainPackage = "./hooks/cmd/in-cluster"
)

// Links are the other names the chart calls, each a link to Binary in the image, sorted.
var Links = []string{DriverManager, Validator}

// About is Binary's own help text on the other commands it holds and the ones it does not.
const About = "The same binary is the node commands, by the name it is started as or by a first argument:\n" +
	"  validator        per-node checks and the status files operands wait on\n" +
	"  driver-manager   node-local driver changes\n" +
	"plan, migrate, image and airgap run on your machine: go run ./hooks/cmd/kube-gpu-stack (see the README)."

// Select returns the command argv names and the arguments for it: argv[0]'s base name when it is one of Links,
// else the first argument when that is one, else Binary with every argument. The arguments are never nil (a nil
// slice would make cobra read os.Args).
func Select(argv []string) (string, []string) {
	name, args := Binary, []string{}
	if len(argv) > 0 {
		name, args = filepath.Base(argv[0]), argv[1:]
	}
	if !slices.Contains(Links, name) {
		name = Binary
		if len(args) > 0 && slices.Contains(Links, args[0]) {
			name, args = args[0], args[1:]
		}
	}
	return name, args
}
