// Package duocli holds the duo CLI stand-in (duo.js) for the npm stand-in to serve as
// @gitlab/duo-cli; tests/cluster/images-duo.sh bakes the same file into the hardened image.
package duocli

import (
	_ "embed"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakenpm"
)

//go:embed duo.js
var script string

// Version is the stand-in's version as the npm stand-in publishes it.
const Version = "1.0.0"

// Package is @gitlab/duo-cli as `npm install -g` installs it: the duo command.
func Package() fakenpm.Package {
	return fakenpm.Package{Name: "@gitlab/duo-cli", Version: Version,
		Files: map[string]string{"bin/duo.js": script}, Bin: map[string]string{"duo": "bin/duo.js"}}
}
