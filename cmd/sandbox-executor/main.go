// Command sandbox-executor is a GitLab Runner custom executor that runs every job in a gVisor
// pod claimed from an agent-sandbox SandboxWarmPool.
package main

import "github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor/app"

func main() { app.Main() }
