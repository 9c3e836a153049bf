// Command sandbox-executor-stage is the stage launcher: named in prepare_exec, run_exec and cleanup_exec,
// it hands the stage to the stage server (sandbox-executor serve) without loading the executor,
// and otherwise becomes sandbox-executor with the same arguments.
package main

import "github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor-stage/launcher"

func main() { launcher.Main() }
