// Package agent is the program the executor runs in every job pod (cmd/sandbox-executor-agent).
// It runs each stage detached from the stream that started it, in its own process group, with
// the output in a file and the exit status in another, so that a dropped stream can re-attach and
// resume from the last byte delivered, and a stage's status is never guessed. Its protocol with
// the executor is package wire; the layout it keeps in the pod is described there.
//
// It uses only the standard library: it is copied into the pod once per job, so it stays small.
package agent
