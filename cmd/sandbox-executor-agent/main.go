// Command sandbox-executor-agent runs inside job pods; see package agent.
package main

import (
	"os"

	"github.com/sandbox-executor/sandbox-executor/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
