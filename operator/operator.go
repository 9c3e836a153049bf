// Package operator holds the commands an operator runs by hand, as opposed to the runner's
// protocol stages: gc and doctor, a package each. Each verb owns its flags (Command) and calls a
// small core (Run) with them.
package operator

import (
	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Setup turns a command's core into the CLI action: it loads the configuration and builds the
// invocation's Env (cmd/sandbox-executor/app).
type Setup func(run func(c *cli.Context, env *stages.Env) error) cli.ActionFunc
