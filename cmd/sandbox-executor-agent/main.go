// Command sandbox-executor-agent runs inside job pods; see package agent.
//
// Its argv is parsed by package agent with the standard library's flag package, not urfave/cli
// like the other binaries: the agent is copied into every job pod and links the standard library
// only (docs/architecture.md), and the executor's command lines for it are part of the wire
// protocol (agent/wire), which a parser of other conventions must not change.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/sandbox-executor/sandbox-executor/agent"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// about is what a person who runs the agent by hand is told: the executor is what runs it.
const about = `sandbox-executor-agent: the agent of sandbox-executor inside a job pod. The executor starts it
(over exec, or as the pod's network agent) to run the job's stages detached, and talks to it in
its own protocol; it is not a command to run by hand.

usage: sandbox-executor-agent init|probe|fence|start|kill|serve|install [flags]
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 1 && slices.Contains([]string{"--help", "-help", "-h", "help"}, args[0]) {
		fmt.Fprint(stdout, about)
		return 0
	}
	return agent.Main(args, stdin, stdout, stderr)
}
