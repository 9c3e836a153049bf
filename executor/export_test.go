package executor

// SetAgentPort moves the port the network probe dials, for agents served on the host.
func SetAgentPort(port int) (restore func()) {
	old := agentPort
	agentPort = port
	return func() { agentPort = old }
}
