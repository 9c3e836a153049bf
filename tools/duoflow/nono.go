package duoflow

import (
	"strings"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// nonoFSGrants are the filesystem grants GitLab gives nono (Gitlab::DuoWorkflow::Sandbox
// NONO_FS_GRANTS).
var nonoFSGrants = []string{
	`--allow .`, `--allow /tmp`,
	`--read-file "$HOME/.gitconfig"`, `--read-file "$HOME/.gitignore_global"`,
	`--read "$HOME/.config/git"`, `--read "$HOME/.config/glab-cli"`,
	`--read-file "${CI_PROJECT_DIR:-$PWD}.tmp/.gitlab-runner.ext.conf"`, `--read-file "${CI_PROJECT_DIR:-$PWD}.tmp/.glr.gconf"`,
	`--read "$HOME/.gitlab"`, `--read "$HOME/.agents"`,
	`--read "$(git --exec-path 2>/dev/null || echo /usr/libexec/git-core)"`,
}

// nonoEnv are the variables GitLab passes through nono's env -i: the flow's own (a few of
// them here), its sandbox variables, PATH and GITLAB_WORKFLOW_SANDBOX.
var nonoEnv = []string{"DUO_WORKFLOW_GOAL", "DUO_WORKFLOW_SERVICE_SERVER", "DUO_WORKFLOW_SERVICE_TOKEN", "GITLAB_BASE_URL", "GITLAB_TOKEN",
	"GITLAB_OAUTH_TOKEN", "NPM_CONFIG_CACHE", "GITLAB_LSP_STORAGE_DIR", "TMPDIR", "PATH", "GITLAB_WORKFLOW_SANDBOX"}

// NonoWrapped is command as GitLab wraps it when an instance turns on the feature flag
// duo_workflow_nono_sandbox (Gitlab::DuoWorkflow::Sandbox#wrap_command_nono, rewritten here),
// allowing instanceHost and its subdomains: the wrapper probes nono with the flow's own policy
// and refuses to run the flow (exit 1) when nono is missing or its pre-check fails.
func NonoWrapped(command, instanceHost string) string {
	env := []string{`env -i HOME="$HOME"`}
	for _, v := range nonoEnv {
		env = append(env, v+`="$`+v+`"`)
	}
	policy := strings.Join(nonoFSGrants, " ")
	for _, d := range []string{"host.docker.internal", "localhost", instanceHost, `\*.` + instanceHost} {
		policy += " --allow-domain " + d
	}
	run := strings.Join(env, " ") + " nono run " + policy + " -- "
	const docs = `  echo "For more details visit: https://docs.gitlab.com/user/duo_agent_platform/flows/execution/#configure-runners"`
	return strings.Join([]string{
		`if command -v nono > /dev/null 2>&1; then`,
		`  echo "nono found, testing Landlock sandbox capabilities..."`,
		`  if nono_precheck_output="$(` + run + `true 2>&1)"; then`,
		`    echo "nono sandbox test successful, running command under Landlock sandbox: ` + command + `"`,
		`    export GITLAB_WORKFLOW_SANDBOX=true`,
		`    ` + run + command,
		`  else`,
		`    echo "Error: nono found but the sandbox pre-check failed, refusing to run without a sandbox"`,
		`    echo "nono reported: $nono_precheck_output"`,
		`    echo "Likely causes: Landlock unavailable (needs Linux 5.13+), or a grant nono refuses"`,
		"  " + docs,
		`    exit 1`,
		`  fi`,
		`else`,
		`  echo "Error: nono not found on PATH (image must ship it), refusing to run without a sandbox"`,
		docs,
		`  exit 1`,
		`fi`,
		`echo "Command execution completed with exit code: $?"`,
	}, "\n")
}

// NonoStandIn is a setup_script that puts a stand-in for nono first on PATH: nono's first step
// for real, its Landlock ABI query (landlock_create_ruleset with
// LANDLOCK_CREATE_RULESET_VERSION, x86-64 syscall 444, made with perl's syscall), printing the
// answer, then nono's own failure line and status when the kernel has no Landlock. Where it
// has, the stand-in runs nothing (exit 3): it is not nono, and nothing here pretends to be.
var NonoStandIn = []string{
	`mkdir -p "$HOME/.local/bin" && cat > "$HOME/.local/bin/nono" <<'NONO'
#!/bin/sh
abi=$(perl -e '$! = 0; my $r = syscall(444, 0, 0, 1); print $r < 0 ? "errno " . ($! + 0) : "abi $r"')
echo "nono stand-in: landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION): $abi" >&2
case $abi in abi*) exit 3 ;; esac
echo "nono: Sandbox initialization failed: Landlock not available. Requires Linux kernel 5.13+ with Landlock enabled." >&2
exit 1
NONO
chmod +x "$HOME/.local/bin/nono" && export PATH="$HOME/.local/bin:$PATH"`,
}

// NonoJob is the flow's job for commit sha on image as GitLab makes it with
// duo_workflow_nono_sandbox on: setupScript (agent-config.yml's), then `duo run` wrapped in nono.
func (inst *Instance) NonoJob(sha, image string, setupScript ...string) fakegitlab.Job {
	job := inst.Job(sha, image)
	script := append([]string{"mkdir -p /var/tmp/.gitlab-sandbox"}, setupScript...)
	job.Steps[0].Script = append(script, NonoWrapped(`duo run --existing-session-id "$CI_JOB_ID" --connection-type websocket`, inst.Host))
	job.Artifacts = nil
	job.Cache = nil
	return job
}
