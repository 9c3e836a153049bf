package executor

// Connected waits for the connection made ahead and reports whether it was made.
func (d *AgentDial) Connected() bool {
	<-d.done
	return d.conn != nil
}
