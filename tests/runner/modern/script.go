package modern

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
)

// Stage names, as the runner passes them to run_exec (step_script reaches
// run_exec as build_script).
const (
	StagePrepareScript         = "prepare_script"
	StageGetSources            = "get_sources"
	StageClearWorktree         = "clear_worktree"
	StageRestoreCache          = "restore_cache"
	StageDownloadArtifacts     = "download_artifacts"
	StageStepScript            = "step_script"
	StageBuildScript           = "build_script"
	StageAfterScript           = "after_script"
	StageArchiveCache          = "archive_cache"
	StageArchiveCacheOnFailure = "archive_cache_on_failure"
	StageUploadOnSuccess       = "upload_artifacts_on_success"
	StageUploadOnFailure       = "upload_artifacts_on_failure"
	StageCleanupFileVariables  = "cleanup_file_variables"
)

const (
	gitStrategyNone  = "none"
	gitStrategyEmpty = "empty"
	gitStrategyFetch = "fetch"
	gitStrategyClone = "clone"

	cacheRequestTimeoutMinutes = "10"

	// Colours of the runner's job log (helpers/ansi.go).
	ansiBoldGreen = "\x1b[32;1m"
	ansiBoldCyan  = "\x1b[36;1m"
	ansiBoldRed   = "\x1b[31;1m"
	ansiYellow    = "\x1b[0;33m"
	ansiReset     = "\x1b[0;m"
)

// stageDescriptions are the lines the runner logs before each stage.
var stageDescriptions = map[string]string{
	StagePrepareScript:         "Preparing environment",
	StageGetSources:            "Getting source from Git repository",
	StageClearWorktree:         "Deleting all tracked and untracked files due to source fetch failure",
	StageRestoreCache:          "Restoring cache",
	StageDownloadArtifacts:     "Downloading artifacts",
	StageAfterScript:           "Running after_script",
	StageArchiveCache:          "Saving cache for successful job",
	StageArchiveCacheOnFailure: "Saving cache for failed job",
	StageUploadOnSuccess:       "Uploading artifacts for successful job",
	StageUploadOnFailure:       "Uploading artifacts for failed job",
	StageCleanupFileVariables:  "Cleaning up project directory and file based variables",
}

func stageDescription(stage string) string {
	if description, ok := stageDescriptions[stage]; ok {
		return description
	}
	return fmt.Sprintf("Executing %q stage of the job script", stage)
}

// scriptWriter builds the body of a stage script the way the runner's
// BashWriter does; finish wraps it into the file run_exec receives.
type scriptWriter struct {
	body   strings.Builder
	tmpDir string // the project's .tmp directory, home of file variables
}

func (w *scriptWriter) line(text string)                    { w.body.WriteString(text + "\n") }
func (w *scriptWriter) linef(format string, args ...any)    { w.line(fmt.Sprintf(format, args...)) }
func (w *scriptWriter) command(name string, args ...string) { w.line(commandLine(name, args...)) }
func (w *scriptWriter) noticef(format string, args ...any) {
	w.line("echo " + shellQuote(ansiBoldGreen+fmt.Sprintf(format, args...)+ansiReset))
}
func (w *scriptWriter) warningf(format string, args ...any) {
	w.line("echo " + shellQuote(ansiYellow+fmt.Sprintf(format, args...)+ansiReset))
}
func (w *scriptWriter) tmpFile(name string) string { return path.Join(w.tmpDir, name) }

func commandLine(name string, args ...string) string {
	quoted := make([]string, 0, len(args)+1)
	quoted = append(quoted, shellQuote(name))
	for _, arg := range args {
		quoted = append(quoted, shellQuote(arg))
	}
	return strings.Join(quoted, " ")
}

// exportVariables writes every job variable: file variables into files under
// the .tmp directory, the others as plain exports; then GITLAB_ENV, whose
// KEY=VALUE lines earlier stages may have appended, is sourced.
func (w *scriptWriter) exportVariables(all variables, writeFiles bool) {
	for _, variable := range all {
		if !variable.File {
			w.linef("export %s=%s", variable.Key, shellQuote(variable.Value))
			continue
		}
		file := w.tmpFile(variable.Key)
		if writeFiles {
			w.command("mkdir", "-p", w.tmpDir)
			w.linef("printf '%%s' %s > %s", shellQuote(variable.Value), shellQuote(file))
		}
		w.linef("export %s=%s", variable.Key, shellQuote(file))
	}
	envFile := w.tmpFile("gitlab_runner_env")
	w.linef("export GITLAB_ENV=%s", shellQuote(envFile))
	w.command("mkdir", "-p", w.tmpDir)
	w.command("touch", envFile)
	w.linef(`while read -r line; do export "$line"; done < %s`, shellQuote(envFile))
}

// guardRunnerCommand runs body only if the runner binary exists in the job
// environment, as the cache and artifact stages do.
func (w *scriptWriter) guardRunnerCommand(runnerCommand, feature string, body func()) {
	w.linef("if %s >/dev/null 2>&1; then", commandLine(runnerCommand, "--version"))
	body()
	w.line("else")
	w.warningf("Missing %s. %s is disabled.", runnerCommand, feature)
	w.line("fi")
}

func (w *scriptWriter) userCommands(commands []string) {
	for _, command := range commands {
		command = strings.TrimSpace(command)
		if command == "" {
			w.line("echo")
			continue
		}
		first, _, multiline := strings.Cut(command, "\n")
		if multiline {
			w.noticef("$ %s # collapsed multi-line command", first)
		} else {
			w.noticef("$ %s", command)
		}
		w.line(command)
	}
}

// finish wraps the body like BashWriter.Finish: `trap exit 1 TERM` keeps a
// canceled bash from dumping the script into the log, errexit stops at the
// first failing command, and the eval'ed body reads no stdin.
func (w *scriptWriter) finish(debugTrace bool) string {
	var script strings.Builder
	script.WriteString("#!/usr/bin/env bash\n\n")
	script.WriteString("trap exit 1 TERM\n\n")
	if debugTrace {
		script.WriteString("set -o xtrace\n")
	}
	script.WriteString("if set -o | grep pipefail > /dev/null; then set -o pipefail; fi; set -o errexit\n")
	script.WriteString("set +o noclobber\n")
	script.WriteString(": | eval " + shellQuote(w.body.String()) + "\n")
	script.WriteString("exit 0\n")
	return script.String()
}

// shellQuote quotes s for bash: as is when it is plainly safe, otherwise as
// an ANSI-C $'...' string, like the runner's helpers.ShellEscape.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	if strings.IndexFunc(s, func(r rune) bool { return !isShellSafe(r) }) < 0 {
		return s
	}
	var quoted strings.Builder
	quoted.WriteString("$'")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '\'':
			quoted.WriteByte('\\')
			quoted.WriteByte(c)
		case '\n':
			quoted.WriteString(`\n`)
		case '\t':
			quoted.WriteString(`\t`)
		case '\r':
			quoted.WriteString(`\r`)
		default:
			if c < 0x20 || c == 0x7f {
				fmt.Fprintf(&quoted, `\x%02x`, c)
			} else {
				quoted.WriteByte(c)
			}
		}
	}
	quoted.WriteString("'")
	return quoted.String()
}

func isShellSafe(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_@%+=:,./-", r)
}

// stageScript generates the script for stage, or reports that the stage has
// nothing to do, in which case the runner does not call run_exec for it.
func (d *driver) stageScript(stage string) (script string, skip bool, err error) {
	w := &scriptWriter{tmpDir: d.dirs.tmpProject()}
	all := d.allVariables()

	switch stage {
	case StagePrepareScript:
		if d.hostname != "" {
			w.line(`echo "Running on $(hostname) via ` + d.hostname + `..."`)
		} else {
			w.line(`echo "Running on $(hostname)..."`)
		}
		w.command("rm", "-f", w.tmpFile("gitlab_runner_env"))
		w.command("rm", "-f", w.tmpFile("masking.db"))
	case StageGetSources:
		w.exportVariables(all, true)
		w.line("export GIT_TERMINAL_PROMPT=0")
		w.line("export GCM_INTERACTIVE=Never")
		if err := d.writeGetSources(w, all); err != nil {
			return "", false, err
		}
	case StageClearWorktree:
		w.noticef("Deleting tracked and untracked files...")
		w.linef("if [ -d %s ]; then", shellQuote(d.dirs.project))
		w.command("cd", d.dirs.project)
		w.command("git", "rm", "-rf", "--ignore-unmatch", "--quiet", ".")
		w.command("git", "clean", "-ffdx", "-q")
		w.line("fi")
	case StageRestoreCache:
		skip = !d.writeCacheStage(w, all, false, true)
	case StageDownloadArtifacts:
		skip = !d.writeDownloadArtifacts(w, all)
	case StageAfterScript:
		commands := d.stepScript(fakegitlab.StepNameAfterScript)
		if len(commands) == 0 {
			return "", true, nil
		}
		w.exportVariables(all, false)
		w.command("cd", d.dirs.project)
		w.noticef("Running after script...")
		w.userCommands(commands)
	case StageArchiveCache, StageArchiveCacheOnFailure:
		skip = !d.writeCacheStage(w, all, stage == StageArchiveCache, false)
	case StageUploadOnSuccess, StageUploadOnFailure:
		skip = !d.writeUploadArtifacts(w, all, stage == StageUploadOnSuccess)
	case StageCleanupFileVariables:
		w.exportVariables(all, false)
		for _, name := range []string{"gitlab_runner_env", "masking.db", ".gitlab-runner.ext.conf"} {
			w.command("rm", "-f", w.tmpFile(name))
		}
		for _, variable := range all {
			if variable.File {
				w.command("rm", "-f", w.tmpFile(variable.Key))
			}
		}
	default: // step_<name>: one of the job's script steps
		step, ok := d.stepForStage(stage)
		if !ok {
			return "", true, nil
		}
		w.exportVariables(all, false)
		w.command("cd", d.dirs.project)
		w.userCommands(step.Script)
	}
	if skip {
		return "", true, nil
	}
	return w.finish(all.get("CI_DEBUG_TRACE") == "true"), false, nil
}

func (d *driver) stepScript(name string) []string {
	for _, step := range d.job.Steps {
		if step.Name == name {
			return step.Script
		}
	}
	return nil
}

func (d *driver) stepForStage(stage string) (fakegitlab.Step, bool) {
	for _, step := range d.job.Steps {
		if step.Name != fakegitlab.StepNameAfterScript && stepStage(step) == stage {
			return step, true
		}
	}
	return fakegitlab.Step{}, false
}

// stepStage is common.StepToBuildStage: "script" runs as step_script.
func stepStage(step fakegitlab.Step) string { return "step_" + strings.ToLower(step.Name) }

func gitStrategy(job fakegitlab.Job, all variables) string {
	if strategy := all.get("GIT_STRATEGY"); strategy != "" {
		return strategy
	}
	if job.AllowGitFetch {
		return gitStrategyFetch
	}
	return gitStrategyClone
}

func (d *driver) writeGetSources(w *scriptWriter, all variables) error {
	project := d.dirs.project
	switch strategy := gitStrategy(d.job, all); strategy {
	case gitStrategyNone:
		w.noticef("Skipping Git repository setup")
		w.command("mkdir", "-p", project)
		return nil
	case gitStrategyEmpty:
		w.noticef("Skipping Git repository setup and creating an empty build directory")
		w.command("rm", "-r", "-f", project)
		w.command("mkdir", "-p", project)
		return nil
	case gitStrategyClone, gitStrategyFetch:
		if strategy == gitStrategyClone {
			w.command("rm", "-r", "-f", project)
		}
		git := d.job.GitInfo
		depth := git.Depth
		if value := all.get("GIT_DEPTH"); value != "" {
			depth, _ = strconv.Atoi(value)
		}
		if depth > 0 {
			w.noticef("Fetching changes with git depth set to %d...", depth)
		} else {
			w.noticef("Fetching changes...")
		}
		template := path.Join(d.dirs.tmpProject(), "git-template")
		w.command("mkdir", "-p", template)
		w.command("git", "config", "-f", path.Join(template, "config"), "fetch.recurseSubmodules", "false")
		w.command("git", "init", project, "--template", template)
		w.command("cd", project)
		w.linef("if %s >/dev/null 2>&1; then", commandLine("git", "remote", "add", "origin", git.RepoURL))
		w.noticef("Created fresh repository.")
		w.line("else")
		w.command("git", "remote", "set-url", "origin", git.RepoURL)
		w.line("fi")
		fetch := append([]string{"fetch", "origin", "--prune"}, git.Refspecs...)
		if depth > 0 {
			fetch = append(fetch, "--depth", strconv.Itoa(depth))
		}
		w.command("git", fetch...)
		w.noticef("Checking out %s as detached HEAD (ref is %s)...", git.Sha[:min(8, len(git.Sha))], git.Ref)
		w.command("git", "-c", "advice.detachedHead=false", "checkout", "-f", "-q", git.Sha)
		w.command("git", "clean", "-ffdx")
		w.noticef("Skipping Git submodules setup")
		return nil
	default:
		return fmt.Errorf("unknown GIT_STRATEGY %q", strategy)
	}
}

// writeCacheStage writes restore_cache (restore) or archive_cache[_on_failure]
// and reports whether any cache applies.
func (d *driver) writeCacheStage(w *scriptWriter, all variables, jobSucceeded, restore bool) bool {
	w.exportVariables(all, false)
	w.command("cd", d.dirs.project)
	anyCache := false
	for _, cache := range d.job.Cache {
		if restore && !cachePolicyAllows(cache.Policy, "pull") {
			continue
		}
		if !restore && (!cachePolicyAllows(cache.Policy, "push") || !cacheWhenApplies(cache.When, jobSucceeded) ||
			len(cache.Paths) == 0 && !cache.Untracked) {
			continue
		}
		anyCache = true
		key := os.Expand(cache.Key, all.get)
		if key == "" {
			key = path.Join(d.job.JobInfo.Name, d.job.GitInfo.Ref)
		}
		args := []string{"--file", path.Join(d.dirs.projectCache, key, "cache.zip"), "--timeout", cacheRequestTimeoutMinutes}
		// The runner's notices around restoring or creating the cache.
		command, feature, starting, done, failed := "cache-extractor", "Extracting cache", "Checking cache for "+key+"...", "Successfully extracted cache", "Failed to extract cache"
		if !restore {
			command, feature, starting, done, failed = "cache-archiver", "Creating cache", "Creating cache "+key+"...", "Created cache", "Failed to create cache"
			for _, cachePath := range cache.Paths {
				args = append(args, "--path", cachePath)
			}
			if cache.Untracked {
				args = append(args, "--untracked")
			}
		}
		w.guardRunnerCommand(d.config.RunnerCommand, feature, func() {
			w.noticef("%s", starting)
			w.linef("if %s; then", commandLine(d.config.RunnerCommand, append([]string{command}, args...)...))
			w.noticef("%s", done)
			w.line("else")
			w.warningf("%s", failed)
			w.line("fi")
		})
	}
	return anyCache
}

func cachePolicyAllows(policy, direction string) bool {
	return policy == "" || policy == "pull-push" || policy == direction
}

func cacheWhenApplies(when string, jobSucceeded bool) bool {
	switch when {
	case fakegitlab.WhenAlways:
		return true
	case fakegitlab.WhenOnFailure:
		return !jobSucceeded
	default:
		return jobSucceeded
	}
}

func (d *driver) writeDownloadArtifacts(w *scriptWriter, all variables) bool {
	var dependencies []fakegitlab.Dependency
	for _, dependency := range d.job.Dependencies {
		if dependency.ArtifactsFile.Filename != "" {
			dependencies = append(dependencies, dependency)
		}
	}
	if len(dependencies) == 0 {
		return false
	}
	w.exportVariables(all, false)
	w.command("cd", d.dirs.project)
	w.guardRunnerCommand(d.config.RunnerCommand, "Artifacts downloading", func() {
		for _, dependency := range dependencies {
			w.noticef("Downloading artifacts for %s (%d)...", dependency.Name, dependency.ID)
			w.command(d.config.RunnerCommand, "artifacts-downloader",
				"--url", d.serverURL(), "--token", dependency.Token, "--id", strconv.FormatInt(dependency.ID, 10))
		}
	})
	return true
}

func (d *driver) writeUploadArtifacts(w *scriptWriter, all variables, jobSucceeded bool) bool {
	if d.serverURL() == "" {
		return false
	}
	w.exportVariables(all, false)
	w.command("cd", d.dirs.project)
	anyArtifact := false
	for _, artifact := range d.job.Artifacts {
		when := artifact.When
		applies := jobSucceeded && (when == "" || when == fakegitlab.WhenOnSuccess || when == fakegitlab.WhenAlways) ||
			!jobSucceeded && (when == fakegitlab.WhenOnFailure || when == fakegitlab.WhenAlways)
		if !applies || len(artifact.Paths) == 0 && !artifact.Untracked {
			continue
		}
		anyArtifact = true
		args := []string{"artifacts-uploader",
			"--url", d.serverURL(), "--token", d.job.Token, "--id", strconv.FormatInt(d.job.ID, 10)}
		for _, artifactPath := range artifact.Paths {
			args = append(args, "--path", artifactPath)
		}
		for _, exclude := range artifact.Exclude {
			args = append(args, "--exclude", exclude)
		}
		if artifact.Untracked {
			args = append(args, "--untracked")
		}
		args = append(args, "--artifact-format", valueOr(artifact.Format, "zip"), "--artifact-type", valueOr(artifact.Type, "archive"))
		if artifact.ExpireIn != "" {
			args = append(args, "--expire-in", artifact.ExpireIn)
		}
		if artifact.Name != "" {
			args = append(args, "--name", os.Expand(artifact.Name, all.get))
		}
		w.guardRunnerCommand(d.config.RunnerCommand, "Uploading artifacts", func() {
			w.noticef("Uploading artifacts...")
			w.command(d.config.RunnerCommand, args...)
		})
	}
	return anyArtifact
}

func valueOr(value, fallback string) string {
	if value == "" {
		return fallback
	}
	return value
}
