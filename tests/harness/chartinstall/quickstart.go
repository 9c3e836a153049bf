package chartinstall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/quickstart"
)

// Quickstart is a release installed by the commands of a quickstart of the docs
// (tests/harness/quickstart), run as written in a directory of its own: the user's shell.
type Quickstart struct {
	*Release
	// Dir holds the chart packaged as `make release` names it, the quickstart's files and the
	// instance's CA as gitlab-ca.pem.
	Dir string
	// Commands are the quickstart's, placeholders replaced.
	Commands [][]string
}

// Release names of the docs: every quickstart installs release sandbox-executor.
const docsRelease = "sandbox-executor"

// The documented placeholders a quickstart run replaces, each with what the docs say to put
// there; nothing else of a quickstart is changed.
const (
	placeholderNamespace = "ci-sandbox"                            // section 3's namespace: a fresh one
	placeholderToken     = "glrt-..."                              // the runner authentication token
	placeholderURL       = "https://gitlab.example.com"            // the instance's URL
	placeholderImages    = "registry.example.com/sandbox-executor" // where the images are (section 2)
	placeholderTag       = "v0.1.0"                                // their tag
	placeholderJobImage  = "registry.example.com/duo/ci:bookworm"  // your job image
	placeholderJobRepo   = "registry.example.com/duo/ci"           // its repository (pool patterns)
	imagesRepository     = "sandbox-executor.local"                // where make images imports them
)

// StartQuickstart prepares the run of q: the instance exposed by its cluster DNS name, and a
// directory with the chart package, q's files (files, by name, replace q's own: a site's
// version of a documented file) and the instance's CA. Options.Release is ignored: the docs'
// release is sandbox-executor. Nothing is installed until Run; Close removes what Run made.
func StartQuickstart(ctx context.Context, o Options, q *quickstart.Quickstart, files map[string]string) (*Quickstart, error) {
	if o.InstanceIP == "" {
		return nil, errors.New("chartinstall: Options.InstanceIP is empty: set the instance's address on the instance network")
	}
	tag, err := ImagesTag(o.Root)
	if err != nil {
		return nil, err
	}
	helm, err := Helm(o.Root)
	if err != nil {
		return nil, err
	}
	o.Release = docsRelease
	r := &Release{Options: o, Helm: helm, Tag: tag}
	run := &Quickstart{Release: r}
	if run.Dir, err = os.MkdirTemp("", "quickstart-"+q.Name); err != nil {
		return nil, err
	}
	if r.GitLabURL, err = r.exposeInstance(ctx); err != nil {
		return run, err
	}
	if _, err := Run(helm, "package", filepath.Join(o.Root, "deploy", "chart", "sandbox-executor"), "--destination", run.Dir); err != nil {
		return run, err
	}
	own := &quickstart.Quickstart{Name: q.Name, Files: map[string]string{}}
	for name, text := range q.Files {
		own.Files[name] = text
	}
	for name, text := range files {
		if _, ok := own.Files[name]; !ok {
			return run, fmt.Errorf("quickstart %s has no file %s to replace", q.Name, name)
		}
		own.Files[name] = text
	}
	placeholders := run.Placeholders()
	if err := own.WriteFiles(run.Dir, placeholders); err != nil {
		return run, err
	}
	if o.InstanceCA != nil {
		if err := os.WriteFile(filepath.Join(run.Dir, "gitlab-ca.pem"), o.InstanceCA, 0o600); err != nil {
			return run, err
		}
	}
	run.Commands, err = q.Argv(placeholders)
	return run, err
}

// Placeholders are the documented placeholders with this run's values.
func (q *Quickstart) Placeholders() quickstart.Placeholders {
	jobRepo, _, _ := strings.Cut(q.JobImage, ":")
	return quickstart.Placeholders{
		placeholderNamespace: q.Namespace,
		placeholderToken:     q.RunnerToken,
		placeholderURL:       q.GitLabURL,
		placeholderImages:    imagesRepository,
		placeholderTag:       q.Tag,
		placeholderJobImage:  q.JobImage,
		placeholderJobRepo:   jobRepo,
	}
}

// Split returns the commands that do not start with prefix, in order, and those that do: what
// to run before a test's own steps, and after them (the docs' uninstall section stands before a
// later quickstart's own steps: the VM quickstart's).
func (q *Quickstart) Split(prefix ...string) (before, after [][]string) {
	for _, args := range q.Commands {
		if len(args) >= len(prefix) && slices.Equal(args[:len(prefix)], prefix) {
			after = append(after, args)
		} else {
			before = append(before, args)
		}
	}
	return before, after
}

// RunCommands runs commands in Dir as the user's shell would, kubectl and helm being the
// cluster's and the pinned one, with the admin kubeconfig. Where the docs have the user wait
// (before a `kubectl exec deploy/NAME`), it waits for the namespace's Deployments first.
// It returns each command's output, and stops at the first that fails.
func (q *Quickstart) RunCommands(commands [][]string) ([]string, error) {
	var outputs []string
	for _, args := range commands {
		if args[0] == "kubectl" && slices.Contains(args, "exec") {
			if err := q.waitForExecTarget(args); err != nil {
				return outputs, err
			}
		}
		// The cluster's kubectl and the pinned helm under the names the docs use.
		name := map[string]string{"kubectl": filepath.Join(q.Env.Dir, "bin", "kubectl"), "helm": q.Helm}[args[0]]
		if name == "" {
			name = args[0]
		}
		cmd := exec.Command(name, args[1:]...)
		cmd.Dir = q.Dir
		cmd.Env = append(os.Environ(), "KUBECONFIG="+q.Env.AdminKubeconfig())
		out, err := cmd.CombinedOutput()
		outputs = append(outputs, string(out))
		if err != nil {
			return outputs, fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "helm" && len(args) > 1 && args[1] == "uninstall" {
			q.uninstalled = true
		}
	}
	return outputs, nil
}

// waitForExecTarget waits, before a kubectl exec, for every Deployment of the namespace to be
// available: the pod exec needs, and what it checks (doctor asks the egress proxy), as a user
// waits for the install to come up before checking it.
func (q *Quickstart) waitForExecTarget(args []string) error {
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "deploy/") }) {
		return nil
	}
	_, err := q.Kubectl("-n", q.Namespace, "wait", "--for=condition=Available", "deployment", "--all", "--timeout="+rolloutTimeout.String())
	if err != nil {
		return fmt.Errorf("%w\n%s", err, q.Diagnose())
	}
	return nil
}

// Diagnose describes the namespace's pods and events, for a failure message.
func (q *Quickstart) Diagnose() string {
	pods, _ := q.Kubectl("-n", q.Namespace, "get", "pods", "-o", "wide")
	events, _ := q.Kubectl("-n", q.Namespace, "get", "events", "--sort-by=.lastTimestamp")
	if lines := strings.Split(strings.TrimSpace(events), "\n"); len(lines) > 40 {
		events = strings.Join(lines[len(lines)-40:], "\n")
	}
	return "pods:\n" + pods + "\nevents:\n" + events
}

// rolloutTimeout bounds the wait for a Deployment: image start and, for the runner, registration.
const rolloutTimeout = 5 * time.Minute

// Close deletes the namespaces and the directory.
func (q *Quickstart) Close() error {
	err := q.Release.Close()
	if q.Dir != "" {
		err = errors.Join(err, os.RemoveAll(q.Dir))
	}
	return err
}
