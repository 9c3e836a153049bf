package stages

import "github.com/urfave/cli/v2"

// Setup turns a verb's core into its CLI action: it loads the configuration and builds the
// invocation's Env (cmd/sandbox-executor/app), so that every verb that reads the config and the
// cluster gets them, and fails on them, the same way.
type Setup func(run func(c *cli.Context, env *Env) error) cli.ActionFunc
