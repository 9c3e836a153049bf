// Package executor runs a job in its pod once prepare has claimed it: it installs the agent over
// exec or connects to a baked-in one over the pod network (ConnectAgent, ConnectNetwork, each
// returning a Connection: the Transport, and why exec if so), checks the pod's egress fence,
// copies the runner helper, runs each runner stage through the agent (StageRunner: detached
// stages, re-attached after a dropped stream, never a false success) and keeps the job's state
// between the runner's processes (SaveJob, LoadJob: a versioned record in $TMPDIR). It asks
// Kubernetes only through package kube, and the stages (stages/*) are its callers.
package executor
