// Package environ reads and edits a process environment given as KEY=value strings (os.Environ,
// exec.Cmd.Env): the stage server reads a stage's from its request, start-runner the runner's.
package environ

import (
	"slices"
	"strings"
)

// Lookup returns name's value in environ, empty if unset. Of duplicates the last wins, as in
// os/exec and as gitlab-runner means it: it appends the job's variables after its own.
func Lookup(environ []string, name string) string {
	for _, kv := range slices.Backward(environ) {
		if value, ok := strings.CutPrefix(kv, name+"="); ok {
			return value
		}
	}
	return ""
}

// Without returns environ without any entry for name.
func Without(environ []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
}
